// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"context"
	"database/sql/driver"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
)

// The builders of a MySQL probe: pure functions of the probe's fields, its credentials and the
// pod's address, tested as tables (mysqlconfig_internal_test.go). What they build is used by
// probeMySQL.

// defaultMySQLUser is the account used when a probe names no credential Secret.
const defaultMySQLUser = "root"

// mysqlConnectionAttributes are shown in performance_schema.session_connect_attrs.
const mysqlConnectionAttributes = "program_name:" + applicationName

// mysqlQuery is the probe's query, or the default one when it is blank.
func mysqlQuery(query string) string {
	if strings.TrimSpace(query) == "" {
		return v1alpha1.DefaultMySQLQuery
	}
	return query
}

// mysqlConfig builds the driver's config of one probe run: the pod's address as the only one
// ever dialled (dialFn), the database, the account and password of creds (nil: the default
// account, no password, no TLS), the TLS setup of creds' tlsMode (credentialsTLSConfig, the
// PostgreSQL probe's), timeout as the dial, read and write deadline, and every option that
// could read a local file, send a clear-text password to an unproven server, run several
// statements or query the server at connect time turned off. No DSN is built: user input
// never passes through the driver's DSN parser.
func mysqlConfig(addr netip.AddrPort, dbName string, creds *credentials.Credentials, timeout time.Duration,
	dialFn func(ctx context.Context, network, address string) (net.Conn, error),
) *mysql.Config {
	cfg := mysql.NewConfig()
	cfg.Net = "tcp"
	cfg.Addr = addr.String()
	cfg.DialFunc = dialFn
	cfg.DBName = dbName
	cfg.User = defaultMySQLUser
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = timeout, timeout, timeout
	// Set, so the driver does not ask the server for max_allowed_packet; it bounds what the
	// probe writes (the query), not what it reads (mysqlPacketConn does that).
	cfg.MaxAllowedPacket = maxMySQLPacketBytes
	cfg.Logger = &mysql.NopLogger{}
	cfg.ConnectionAttributes = mysqlConnectionAttributes
	cfg.CheckConnLiveness = false
	cfg.AllowAllFiles = false
	cfg.AllowOldPasswords = false
	cfg.AllowNativePasswords = true
	cfg.AllowCleartextPasswords = false
	cfg.AllowFallbackToPlaintext = false
	cfg.MultiStatements = false
	cfg.InterpolateParams = false
	cfg.ParseTime = false
	if creds != nil {
		cfg.User = creds.User
		cfg.Passwd = creds.Password()
		cfg.TLS = credentialsTLSConfig(creds, addr.Addr())
		// Only a server that proved who it is may see the password in clear text.
		cfg.AllowCleartextPasswords = creds.VerifiesServer()
	}
	return cfg
}

// mysqlVerdict judges a query's result: gotRow says whether it returned a row, value is the
// first column of that row as the driver decodes it (nil for NULL, int64 or uint64 for
// integer columns, float32 or float64 for FLOAT and DOUBLE, []byte for the rest). True is a
// number other than zero (TRUE is 1 in MySQL, and comparisons such as @@read_only = 0 give 1
// or 0) or the text "true" in any case; everything else fails, and the reason names it.
func mysqlVerdict(gotRow bool, value driver.Value) Result {
	if !gotRow {
		return failure("query returned no rows")
	}
	var text string
	switch v := value.(type) {
	case nil:
		return failure("query returned NULL")
	case int64:
		return numberVerdict(v == 0, strconv.FormatInt(v, 10))
	case uint64:
		return numberVerdict(v == 0, strconv.FormatUint(v, 10))
	case float32:
		return numberVerdict(v == 0, strconv.FormatFloat(float64(v), 'g', -1, 32))
	case float64:
		return numberVerdict(v == 0, strconv.FormatFloat(v, 'g', -1, 64))
	case []byte:
		text = strings.TrimSpace(string(v))
	case string:
		text = strings.TrimSpace(v)
	default:
		return failure("query returned a value of an unexpected type")
	}
	if zero, ok := decimalZero(text); ok {
		return numberVerdict(zero, text)
	}
	switch {
	case strings.EqualFold(text, "true"):
		return success("query returned a true value")
	case strings.EqualFold(text, "false"):
		return failure("query returned false")
	}
	return failure("query returned " + strconv.Quote(serverText(text, 40)) + ", not a number or true")
}

// numberVerdict passes a number other than zero; shown is how the reason prints it.
func numberVerdict(zero bool, shown string) Result {
	if zero {
		if shown == "0" {
			return failure("query returned false (0)")
		}
		return failure("query returned false (" + shown + ")")
	}
	return success("query returned a true value")
}

// decimalZero reads text as a decimal number as MySQL prints one (optional sign, digits,
// optional fraction: DECIMAL columns arrive as text) and reports whether it is zero. ok is
// false when text is not such a number. No conversion, so any length and precision works.
func decimalZero(text string) (zero, ok bool) {
	s := strings.TrimPrefix(strings.TrimPrefix(text, "-"), "+")
	intPart, frac, hasDot := strings.Cut(s, ".")
	if intPart == "" && (!hasDot || frac == "") {
		return false, false
	}
	zero = true
	for _, part := range [...]string{intPart, frac} {
		for i := 0; i < len(part); i++ {
			switch c := part[i]; {
			case c < '0' || c > '9':
				return false, false
			case c != '0':
				zero = false
			}
		}
	}
	return zero, true
}

// mysqlServerError is how an error the server sent appears in a reason: its message (cleaned
// and cut: it comes from the server) and its error number.
func mysqlServerError(e *mysql.MySQLError) string {
	return serverText(e.Message, maxServerTextBytes) + " (MySQL error " + strconv.Itoa(int(e.Number)) + ")"
}

// mysqlAuthReason names a failed login: access denied reads "access denied for user 'u'@'h'
// (using password: YES)", with a hint for the probe without a Secret.
func mysqlAuthReason(e *mysql.MySQLError, hasCreds bool) string {
	msg := mysqlServerError(e)
	if strings.HasPrefix(msg, "Access denied") {
		msg = "a" + msg[1:]
	}
	if !hasCreds {
		return msg + "; set mySQL.authSecretName"
	}
	return msg
}
