// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package mariadb starts real MariaDB servers (Debian package mariadb-server) for tests: each
// in its own temporary folder, with its own Unix socket and TCP port, TLS with certificates the
// test makes (testkit/pki), accounts with passwords, and a replica that replicates from a
// primary for real (binary log, CHANGE MASTER TO, read_only=1 on the replica), with a failover
// that swaps the roles.
//
// The servers run as the user that runs the test with --user=root when that is root (mariadbd
// refuses root otherwise), so no file needs chowning. The harness connects as root over the
// server's own Unix socket (root@localhost without a password), so TCP clients meet only the
// accounts a test creates.
package mariadb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// The MariaDB programs (Debian package mariadb-server).
const (
	InstallDB = "/usr/bin/mariadb-install-db"
	Daemon    = "/usr/sbin/mariadbd"
)

// TLS is the TLS setup of a server.
type TLS struct {
	// CertPEM and KeyPEM are the server's certificate and key.
	CertPEM, KeyPEM []byte
	// ClientCAPEM verifies client certificates (ssl-ca); also needed for the server to start TLS.
	ClientCAPEM []byte
}

// Options configure a server.
type Options struct {
	// ListenAddress is the TCP address the server listens on; default 127.0.0.1.
	ListenAddress string
	// Port to listen on; 0 picks a free port on ListenAddress (3306 when CommandPrefix is set).
	Port int
	// TLS turns TLS on with these certificates.
	TLS *TLS
	// ServerID is the replication server id; default 1.
	ServerID int
	// Settings are extra mariadbd options, e.g. {"max-connections": "20"}.
	Settings map[string]string
	// CommandPrefix runs the server under a prefix, e.g. {"ip", "netns", "exec", "ns1"}.
	CommandPrefix []string
}

// Server is a MariaDB server the harness started.
type Server struct {
	// Host and Port are the TCP address.
	Host string
	Port int
	// Socket is the server's Unix socket.
	Socket string
	// DataDir is its data folder; LogFile its error log.
	DataDir, LogFile string

	root   string
	opts   Options
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	closed bool
}

// Address is host:port of the server.
func (s *Server) Address() string {
	return net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
}

// Start creates a data folder with mariadb-install-db and starts a server on it. Call Remove.
func Start(ctx context.Context, opts Options) (*Server, error) {
	s, err := newServer(opts)
	if err != nil {
		return nil, err
	}
	args := []string{InstallDB, "--no-defaults", "--datadir=" + s.DataDir, "--auth-root-authentication-method=normal",
		"--skip-test-db", "--skip-name-resolve"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		_ = s.Remove()
		return nil, fmt.Errorf("mariadb-install-db (install mariadb-server: make deps): %w: %s", err, tail(out))
	}
	if err := s.Start(ctx); err != nil {
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
		t.Fatalf("starting MariaDB: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Remove(); err != nil {
			t.Errorf("removing MariaDB: %v", err)
		}
	})
	return s
}

func newServer(opts Options) (*Server, error) {
	if opts.ListenAddress == "" {
		opts.ListenAddress = "127.0.0.1"
	}
	if opts.ServerID == 0 {
		opts.ServerID = 1
	}
	if opts.Port == 0 {
		if len(opts.CommandPrefix) > 0 {
			opts.Port = 3306
		} else {
			p, err := freePort(opts.ListenAddress)
			if err != nil {
				return nil, err
			}
			opts.Port = p
		}
	}
	root, err := os.MkdirTemp("", "swh-mariadb-")
	if err != nil {
		return nil, fmt.Errorf("creating temporary folder: %w", err)
	}
	s := &Server{
		Host: opts.ListenAddress, Port: opts.Port,
		Socket: filepath.Join(root, "mysqld.sock"), DataDir: filepath.Join(root, "data"),
		LogFile: filepath.Join(root, "server.log"), root: root, opts: opts,
	}
	if err := s.writeTLS(); err != nil {
		_ = os.RemoveAll(root)
		return nil, err
	}
	return s, nil
}

func (s *Server) writeTLS() error {
	t := s.opts.TLS
	if t == nil {
		return nil
	}
	for name, data := range map[string][]byte{"server.crt": t.CertPEM, "server.key": t.KeyPEM, "ca.crt": t.ClientCAPEM} {
		if len(data) == 0 {
			continue
		}
		if err := os.WriteFile(filepath.Join(s.root, name), data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return nil
}

// args are the server's command line.
func (s *Server) args() []string {
	args := append([]string{}, s.opts.CommandPrefix...)
	args = append(args, Daemon, "--no-defaults", "--datadir="+s.DataDir, "--socket="+s.Socket,
		"--port="+strconv.Itoa(s.Port), "--bind-address="+s.Host, "--pid-file="+filepath.Join(s.root, "mysqld.pid"),
		"--log-error="+s.LogFile, "--skip-name-resolve", "--innodb-buffer-pool-size=16M",
		"--innodb-log-file-size=8M", "--max-connections=60",
		"--log-bin="+filepath.Join(s.root, "binlog"), "--server-id="+strconv.Itoa(s.opts.ServerID),
		"--innodb-flush-log-at-trx-commit=0", "--sync-binlog=0", "--log-warnings=1")
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	if s.opts.TLS != nil {
		args = append(args, "--ssl-cert="+filepath.Join(s.root, "server.crt"), "--ssl-key="+filepath.Join(s.root, "server.key"))
		if len(s.opts.TLS.ClientCAPEM) > 0 {
			args = append(args, "--ssl-ca="+filepath.Join(s.root, "ca.crt"))
		}
	}
	for k, v := range s.opts.Settings {
		args = append(args, "--"+k+"="+v)
	}
	return args
}

// Start starts a stopped server and waits until it answers on its socket.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("MariaDB already running")
	}
	argv := s.args()
	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // Test harness: the argv is ours.
	cmd.Dir = s.root
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting mariadbd: %w", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) { _ = cmd.Wait(); close(exited) }(s.exited)
	deadline := time.Now().Add(time.Minute)
	for {
		if err := s.ping(ctx); err == nil {
			return nil
		}
		select {
		case <-s.exited:
			s.cmd = nil
			return fmt.Errorf("mariadbd exited at start: %s", s.tailLog())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mariadbd did not answer within a minute: %s", s.tailLog())
		}
	}
}

// Stop stops the server (SIGTERM, a clean shutdown) and keeps its data; Start starts it again.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(ctx)
}

func (s *Server) stopLocked(ctx context.Context) error {
	if s.cmd == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-ctx.Done():
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
	return nil
}

// Remove stops the server and deletes its folder. It is safe to call twice.
func (s *Server) Remove() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = s.stopLocked(ctx)
	if err := os.RemoveAll(s.root); err != nil {
		return fmt.Errorf("removing %s: %w", s.root, err)
	}
	return nil
}

// DB opens a pool of root connections over the Unix socket (database/sql; the caller closes it).
func (s *Server) DB() (*sql.DB, error) {
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User = "unix", s.Socket, "root"
	cfg.MultiStatements = true
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}

func (s *Server) ping(ctx context.Context) error {
	db, err := s.DB()
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	return db.PingContext(ctx)
}

// Exec runs statements as root (several may be separated by ";").
func (s *Server) Exec(ctx context.Context, statements string, args ...any) error {
	db, err := s.DB()
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	if _, err := db.ExecContext(ctx, statements, args...); err != nil {
		return fmt.Errorf("running %q: %w", statements, err)
	}
	return nil
}

// CreateUser creates user@'%' with password (mysql_native_password) and grants it global read
// access; an empty password creates it without one.
func (s *Server) CreateUser(ctx context.Context, user, password string) error {
	return s.Exec(ctx, "CREATE USER "+quote(user)+"@'%' IDENTIFIED BY "+quote(password)+"; GRANT SELECT, PROCESS, REPLICATION CLIENT ON *.* TO "+quote(user)+"@'%'")
}

// StartReplica starts a new server that replicates s for real and is read_only. opts configure
// its own address and TLS; its ServerID defaults to s's plus one.
func (s *Server) StartReplica(ctx context.Context, opts Options) (*Server, error) {
	if opts.ServerID == 0 {
		opts.ServerID = s.opts.ServerID + 1
	}
	r, err := Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	if err := r.ReplicateFrom(ctx, s); err != nil {
		_ = r.Remove()
		return nil, err
	}
	return r, nil
}

// ReplicateFrom makes s a read_only replica of primary from primary's current binary log
// position (primary gets a replication account if it has none).
func (s *Server) ReplicateFrom(ctx context.Context, primary *Server) error {
	if err := primary.Exec(ctx, "CREATE USER IF NOT EXISTS 'swh_repl'@'%' IDENTIFIED BY 'repl'; GRANT REPLICATION SLAVE ON *.* TO 'swh_repl'@'%'"); err != nil {
		return err
	}
	file, pos, err := primary.binlogPosition(ctx)
	if err != nil {
		return err
	}
	return s.Exec(ctx, fmt.Sprintf("STOP SLAVE; SET GLOBAL read_only = 1; CHANGE MASTER TO MASTER_HOST=%s, MASTER_PORT=%d, "+
		"MASTER_USER='swh_repl', MASTER_PASSWORD='repl', MASTER_LOG_FILE=%s, MASTER_LOG_POS=%d, MASTER_USE_GTID=no; START SLAVE",
		quote(primary.Host), primary.Port, quote(file), pos))
}

// Promote stops replication on s and makes it writable.
func (s *Server) Promote(ctx context.Context) error {
	return s.Exec(ctx, "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0")
}

// SetReadOnly sets read_only.
func (s *Server) SetReadOnly(ctx context.Context, on bool) error {
	v := "0"
	if on {
		v = "1"
	}
	return s.Exec(ctx, "SET GLOBAL read_only = "+v)
}

func (s *Server) binlogPosition(ctx context.Context) (string, int64, error) {
	db, err := s.DB()
	if err != nil {
		return "", 0, err
	}
	defer func() { _ = db.Close() }()
	var (
		file           string
		pos            int64
		doDB, ignoreDB sql.NullString
	)
	if err := db.QueryRowContext(ctx, "SHOW MASTER STATUS").Scan(&file, &pos, &doDB, &ignoreDB); err != nil {
		return "", 0, fmt.Errorf("SHOW MASTER STATUS: %w", err)
	}
	return file, pos, nil
}

// QueryInt runs a query as root and returns its first column as an integer.
func (s *Server) QueryInt(ctx context.Context, query string) (int64, error) {
	db, err := s.DB()
	if err != nil {
		return 0, err
	}
	defer func() { _ = db.Close() }()
	var v int64
	if err := db.QueryRowContext(ctx, query).Scan(&v); err != nil {
		return 0, fmt.Errorf("%s: %w", query, err)
	}
	return v, nil
}

// Log returns the server's error log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.LogFile)
	return string(b)
}

func (s *Server) tailLog() string {
	b, _ := os.ReadFile(s.LogFile)
	return tail(b)
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// quote is a MySQL string literal.
func quote(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port on %s: %w", host, err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
