// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package postgres starts real PostgreSQL 15 servers for tests: SCRAM or clear-text password or
// certificate authentication chosen by pg_hba lines, TLS with certificates the test makes (see
// testkit/pki), a primary with a streaming replica, promotion, stop and start.
//
// initdb and postgres refuse to run as root, so when the test runs as root every server command
// runs as the postgres user (runuser -u postgres --) in temporary directories the harness chowns
// to that user. The superuser connects over the server's own Unix socket (trust), so the TCP
// rules of pg_hba are exactly the ones a test asks for.
//
// A typical test package starts its servers once in TestMain (Start, StartReplica, Remove) or
// per test (StartForTest, ReplicaForTest, which remove the server when the test ends, also when
// it fails).
package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BinDir holds the PostgreSQL 15 programs (Debian package postgresql-15).
const BinDir = "/usr/lib/postgresql/15/bin"

// Superuser is the name of the superuser role initdb creates.
const Superuser = "postgres"

// HBA lines for the TCP connections of the common cases (the harness always adds trust for the
// superuser over the Unix socket).
const (
	// HBASCRAM requires SCRAM-SHA-256 for every TCP connection, with or without TLS.
	HBASCRAM = "host all all all scram-sha-256"
	// HBAPassword asks every TCP client for its password in clear text.
	HBAPassword = "host all all all password"
	// HBACert requires TLS and a client certificate whose common name is the role.
	HBACert = "hostssl all all all cert"
)

// TLS is the TLS setup of a server.
type TLS struct {
	// CertPEM and KeyPEM are the server's certificate and key.
	CertPEM, KeyPEM []byte
	// ClientCAPEM verifies client certificates (ssl_ca_file); needed for HBACert.
	ClientCAPEM []byte
}

// Options configure a server.
type Options struct {
	// ListenAddress is the TCP address the server listens on; default 127.0.0.1.
	ListenAddress string
	// Port to listen on; 0 picks a free ephemeral port on ListenAddress (or 5432 when
	// CommandPrefix is set, since a fresh network namespace has every port free).
	Port int
	// HBA are the pg_hba.conf lines for TCP clients, first match wins; default HBASCRAM.
	HBA []string
	// TLS turns ssl on with these certificates; nil leaves ssl off.
	TLS *TLS
	// Settings are extra postgresql.conf settings, e.g. {"log_statement": "'all'"} (values are
	// written as is, so quote strings).
	Settings map[string]string
	// CommandPrefix runs every server command under a prefix, for example
	// {"ip", "netns", "exec", "ns1"} to run the server inside a network namespace.
	CommandPrefix []string
}

// Server is a PostgreSQL server the harness started.
type Server struct {
	// Host is the address the server listens on for TCP.
	Host string
	// Port is its TCP port.
	Port int
	// SocketDir is the folder of its Unix socket.
	SocketDir string
	// DataDir is its data folder.
	DataDir string
	// LogFile is the server log.
	LogFile string

	root     string
	opts     Options
	autoPort bool
	mu       sync.Mutex
	closed   bool
}

// Address is host:port of the server.
func (s *Server) Address() string {
	return net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
}

// Start creates a new cluster with initdb and starts it. Call Remove when done.
func Start(ctx context.Context, opts Options) (*Server, error) {
	s, err := newServer(opts)
	if err != nil {
		return nil, err
	}
	if err := s.run(ctx, filepath.Join(BinDir, "initdb"), "-D", s.DataDir, "-U", Superuser,
		"--auth=trust", "--encoding=UTF8", "--no-sync", "--no-instructions"); err != nil {
		_ = s.Remove()
		return nil, fmt.Errorf("initdb: %w", err)
	}
	if err := s.configure(); err != nil {
		_ = s.Remove()
		return nil, err
	}
	if err := s.firstStart(ctx); err != nil {
		_ = s.Remove()
		return nil, err
	}
	return s, nil
}

// StartForTest is Start for one test: the server is removed when the test ends.
func StartForTest(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatalf("starting PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Remove(); err != nil {
			t.Errorf("removing PostgreSQL: %v", err)
		}
	})
	return s
}

// StartReplica makes a streaming replica of s with pg_basebackup -R and starts it. opts
// configure the replica's own address, TLS and pg_hba lines (default: the primary's HBA).
func (s *Server) StartReplica(ctx context.Context, opts Options) (*Server, error) {
	if opts.HBA == nil {
		opts.HBA = s.opts.HBA
	}
	r, err := newServer(opts)
	if err != nil {
		return nil, err
	}
	if err := r.run(ctx, filepath.Join(BinDir, "pg_basebackup"), "-h", s.SocketDir,
		"-p", strconv.Itoa(s.Port), "-U", Superuser, "-D", r.DataDir, "-R", "-X", "stream",
		"--checkpoint=fast", "--no-sync"); err != nil {
		_ = r.Remove()
		return nil, fmt.Errorf("pg_basebackup: %w", err)
	}
	if err := r.configure(); err != nil {
		_ = r.Remove()
		return nil, err
	}
	if err := r.firstStart(ctx); err != nil {
		_ = r.Remove()
		return nil, err
	}
	return r, nil
}

// firstStart starts a new server. A port the harness picked may be taken by another process
// between picking and binding (test packages run in parallel): then it picks another.
func (s *Server) firstStart(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := s.Start(ctx)
		if err == nil || !s.autoPort || attempt == 5 || !strings.Contains(err.Error(), "already in use") {
			return err
		}
		p, perr := freePort(s.Host)
		if perr != nil {
			return err
		}
		s.Port = p
		if err := s.configure(); err != nil {
			return err
		}
	}
}

// ReplicaForTest is StartReplica for one test: the replica is removed when the test ends.
func (s *Server) ReplicaForTest(t testing.TB, opts Options) *Server {
	t.Helper()
	r, err := s.StartReplica(t.Context(), opts)
	if err != nil {
		t.Fatalf("starting PostgreSQL replica: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Remove(); err != nil {
			t.Errorf("removing PostgreSQL replica: %v", err)
		}
	})
	return r
}

// Start starts a stopped server and waits until it accepts connections.
func (s *Server) Start(ctx context.Context) error {
	if err := s.run(ctx, filepath.Join(BinDir, "pg_ctl"), "-D", s.DataDir, "-l", s.LogFile,
		"-w", "-t", "60", "start"); err != nil {
		return fmt.Errorf("starting PostgreSQL in %s: %w (log: %s)", s.DataDir, err, s.tailLog())
	}
	return nil
}

// Stop stops the server (fast shutdown) and keeps its data; Start starts it again.
func (s *Server) Stop(ctx context.Context) error {
	if err := s.run(ctx, filepath.Join(BinDir, "pg_ctl"), "-D", s.DataDir, "-m", "fast", "-w",
		"-t", "60", "stop"); err != nil {
		return fmt.Errorf("stopping PostgreSQL in %s: %w", s.DataDir, err)
	}
	return nil
}

// Promote turns a replica into a primary and waits until it is one.
func (s *Server) Promote(ctx context.Context) error {
	if err := s.run(ctx, filepath.Join(BinDir, "pg_ctl"), "-D", s.DataDir, "-w", "-t", "60",
		"promote"); err != nil {
		return fmt.Errorf("promoting PostgreSQL in %s: %w", s.DataDir, err)
	}
	return nil
}

// Remove stops the server at once and deletes its folders. It is safe to call twice.
func (s *Server) Remove() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	if _, err := os.Stat(filepath.Join(s.DataDir, "postmaster.pid")); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.run(ctx, filepath.Join(BinDir, "pg_ctl"), "-D", s.DataDir, "-m",
			"immediate", "-w", "-t", "30", "stop"); err != nil {
			errs = append(errs, fmt.Errorf("stopping PostgreSQL in %s: %w", s.DataDir, err))
		}
	}
	if err := os.RemoveAll(s.root); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", s.root, err))
	}
	return errors.Join(errs...)
}

// Connect opens a superuser connection over the Unix socket.
func (s *Server) Connect(ctx context.Context, dbName string) (*pgx.Conn, error) {
	if dbName == "" {
		dbName = "postgres"
	}
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable",
		s.SocketDir, s.Port, Superuser, dbName))
	if err != nil {
		return nil, fmt.Errorf("parsing superuser config: %w", err)
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting as superuser to %s: %w", s.SocketDir, err)
	}
	return c, nil
}

// Exec runs statements as the superuser in database postgres.
func (s *Server) Exec(ctx context.Context, sql string, args ...any) error {
	c, err := s.Connect(ctx, "")
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("running %q: %w", sql, err)
	}
	return nil
}

// CreateRole creates a login role with a password (stored as a SCRAM verifier); an empty
// password creates a role without one, for certificate authentication.
func (s *Server) CreateRole(ctx context.Context, name, password string) error {
	q := "CREATE ROLE " + pgx.Identifier{name}.Sanitize() + " LOGIN"
	if password != "" {
		q += " PASSWORD " + quoteLiteral(password)
	}
	return s.Exec(ctx, q)
}

// InRecovery reports whether the server is a replica (pg_is_in_recovery()).
func (s *Server) InRecovery(ctx context.Context) (bool, error) {
	c, err := s.Connect(ctx, "")
	if err != nil {
		return false, err
	}
	defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
	var r bool
	if err := c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&r); err != nil {
		return false, fmt.Errorf("asking pg_is_in_recovery: %w", err)
	}
	return r, nil
}

// Log returns the server log so far.
func (s *Server) Log() (string, error) {
	b, err := os.ReadFile(s.LogFile)
	if err != nil {
		return "", fmt.Errorf("reading server log: %w", err)
	}
	return string(b), nil
}

func (s *Server) tailLog() string {
	b, _ := os.ReadFile(s.LogFile)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func quoteLiteral(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

func newServer(opts Options) (*Server, error) {
	if opts.ListenAddress == "" {
		opts.ListenAddress = "127.0.0.1"
	}
	if opts.HBA == nil {
		opts.HBA = []string{HBASCRAM}
	}
	autoPort := false
	if opts.Port == 0 {
		if len(opts.CommandPrefix) > 0 {
			opts.Port = 5432
		} else {
			p, err := freePort(opts.ListenAddress)
			if err != nil {
				return nil, err
			}
			opts.Port = p
			autoPort = true
		}
	}
	root, err := os.MkdirTemp("", "swh-pg-")
	if err != nil {
		return nil, fmt.Errorf("creating temporary folder: %w", err)
	}
	s := &Server{
		Host:      opts.ListenAddress,
		Port:      opts.Port,
		SocketDir: filepath.Join(root, "socket"),
		DataDir:   filepath.Join(root, "data"),
		LogFile:   filepath.Join(root, "server.log"),
		root:      root,
		opts:      opts,
		autoPort:  autoPort,
	}
	for _, d := range []string{s.SocketDir, s.DataDir, filepath.Join(root, "tls")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			_ = os.RemoveAll(root)
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	if err := chownTree(root); err != nil {
		_ = os.RemoveAll(root)
		return nil, err
	}
	return s, nil
}

// configure writes harness.conf (included from postgresql.conf), pg_hba.conf and the TLS files.
func (s *Server) configure() error {
	settings := map[string]string{
		"listen_addresses":        quoteLiteral(s.opts.ListenAddress),
		"port":                    strconv.Itoa(s.Port),
		"unix_socket_directories": quoteLiteral(s.SocketDir),
		"fsync":                   "off",
		"synchronous_commit":      "off",
		"full_page_writes":        "off",
		"shared_buffers":          "16MB",
		"max_connections":         "40",
		"wal_level":               "replica",
		"max_wal_senders":         "5",
		"hot_standby":             "on",
		"log_connections":         "on",
		"ssl":                     "off",
		"password_encryption":     "'scram-sha-256'",
	}
	if t := s.opts.TLS; t != nil {
		dir := filepath.Join(s.root, "tls")
		files := map[string][]byte{"server.crt": t.CertPEM, "server.key": t.KeyPEM}
		settings["ssl"] = "on"
		settings["ssl_cert_file"] = quoteLiteral(filepath.Join(dir, "server.crt"))
		settings["ssl_key_file"] = quoteLiteral(filepath.Join(dir, "server.key"))
		if len(t.ClientCAPEM) > 0 {
			files["ca.crt"] = t.ClientCAPEM
			settings["ssl_ca_file"] = quoteLiteral(filepath.Join(dir, "ca.crt"))
		}
		for name, data := range files {
			if err := writeOwned(filepath.Join(dir, name), data); err != nil {
				return err
			}
		}
	}
	for k, v := range s.opts.Settings {
		settings[k] = v
	}
	var conf strings.Builder
	for k, v := range settings {
		fmt.Fprintf(&conf, "%s = %s\n", k, v)
	}
	if err := writeOwned(filepath.Join(s.DataDir, "harness.conf"), []byte(conf.String())); err != nil {
		return err
	}
	mainConf := filepath.Join(s.DataDir, "postgresql.conf")
	b, err := os.ReadFile(mainConf)
	if err != nil {
		return fmt.Errorf("reading postgresql.conf: %w", err)
	}
	if !strings.Contains(string(b), "include 'harness.conf'") {
		b = append(b, "\ninclude 'harness.conf'\n"...)
		if err := writeOwned(mainConf, b); err != nil {
			return err
		}
	}
	hba := "local all all trust\nlocal replication all trust\n" + strings.Join(s.opts.HBA, "\n") + "\n"
	return writeOwned(filepath.Join(s.DataDir, "pg_hba.conf"), []byte(hba))
}

// run runs a PostgreSQL program as the postgres user when the test runs as root.
func (s *Server) run(ctx context.Context, program string, args ...string) error {
	argv := append([]string{}, s.opts.CommandPrefix...)
	if os.Geteuid() == 0 {
		argv = append(argv, "runuser", "-u", "postgres", "--")
	}
	argv = append(argv, program)
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = s.root
	// pg_ctl start leaves postgres running with our stdout open unless it goes to a file.
	cmd.Stdin = nil
	out, err := os.CreateTemp("", "swh-pg-cmd-")
	if err != nil {
		return fmt.Errorf("creating output file: %w", err)
	}
	defer func() { _ = os.Remove(out.Name()) }()
	defer func() { _ = out.Close() }()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(out.Name())
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(b)))
	}
	return nil
}

func writeOwned(path string, data []byte) error {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return chown(path)
}

func chownTree(root string) error {
	return filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return chown(p)
	})
}

var (
	pgUIDOnce sync.Once
	pgUID     = -1
	pgGID     = -1
	pgUIDErr  error
)

func chown(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	pgUIDOnce.Do(func() {
		u, err := user.Lookup("postgres")
		if err != nil {
			pgUIDErr = fmt.Errorf("looking up user postgres (install postgresql-15: make deps): %w", err)
			return
		}
		pgUID, _ = strconv.Atoi(u.Uid)
		pgGID, _ = strconv.Atoi(u.Gid)
	})
	if pgUIDErr != nil {
		return pgUIDErr
	}
	if err := os.Chown(path, pgUID, pgGID); err != nil {
		return fmt.Errorf("chowning %s to postgres: %w", path, err)
	}
	return nil
}

func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port on %s: %w", host, err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
