// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deckhouse/service-with-healthchecks/testkit/grpchealth"
)

// ctlTimeout bounds one control command (a promotion or a rolling restart takes seconds).
const ctlTimeout = 3 * time.Minute

// command is one control command.
type command struct {
	args string // argument synopsis
	help string
	run  func(ctx context.Context, d *demo, arg string) (string, error)
}

// commands are the control commands (development/RUN.md).
var commands = map[string]command{
	"stop-smtp": {help: "stop the SMTP server of vm-0 (connections refused): vm-0 leaves smtp, stays in web", run: func(_ context.Context, d *demo, _ string) (string, error) {
		d.smtp.Stop()
		return "SMTP server of vm-0 stopped", nil
	}},
	"start-smtp": {help: "start the SMTP server of vm-0 again", run: func(_ context.Context, d *demo, _ string) (string, error) {
		return "SMTP server of vm-0 started", d.smtp.Start()
	}},
	"wedge-smtp": {help: "wedge the SMTP server of vm-0 (accepts, never greets): a TCP connect passes, smtp's banner check withdraws vm-0", run: func(_ context.Context, d *demo, _ string) (string, error) {
		d.smtp.SetWedged(true)
		return "SMTP server of vm-0 wedged: it accepts connections and never greets", nil
	}},
	"unwedge-smtp": {help: "make the SMTP server of vm-0 greet new connections again", run: func(_ context.Context, d *demo, _ string) (string, error) {
		d.smtp.SetWedged(false)
		return "SMTP server of vm-0 greets again", nil
	}},
	"fail-web": {help: "make the HTTP server of vm-0 answer 503 (probe and requests fail): vm-0 leaves web, stays in smtp", run: func(_ context.Context, d *demo, _ string) (string, error) {
		d.web.SetHTTPStatus(503)
		return "HTTP server of vm-0 answers 503", nil
	}},
	"heal-web": {help: "make the HTTP server of vm-0 answer 200 again", run: func(_ context.Context, d *demo, _ string) (string, error) {
		d.web.SetHTTPStatus(200)
		return "HTTP server of vm-0 answers 200", nil
	}},
	"grpc-not-serving": {help: "make the gRPC health of orders-0 answer NOT_SERVING for shop.orders.v1.Orders: orders-0 leaves grpc, stays in rest", run: func(_ context.Context, d *demo, _ string) (string, error) {
		return d.setGRPC(grpchealth.NotServing)
	}},
	"grpc-serving": {help: "make the gRPC health of orders-0 answer SERVING again", run: func(_ context.Context, d *demo, _ string) (string, error) {
		return d.setGRPC(grpchealth.Serving)
	}},
	"mysql-failover": {help: "swap the MariaDB roles: the replica becomes the writable primary, the old primary its read_only replica: mysql-db-write follows", run: func(ctx context.Context, d *demo, _ string) (string, error) {
		return d.mysqlFailover(ctx)
	}},
	"promote": {help: "promote the replica (db-1) and stop the old primary (db-0): db-write follows, db-read keeps db-1 only", run: func(ctx context.Context, d *demo, _ string) (string, error) { return d.promote(ctx) }},
	"stop-agent": {args: "NODE", help: "stop the agent of NODE (SIGTERM): after the grace the controller withdraws the node's endpoints", run: func(ctx context.Context, d *demo, node string) (string, error) {
		return "agent of " + node + " stopped", d.s.StopAgent(ctx, node)
	}},
	"start-agent": {args: "NODE", help: "start the agent of NODE again (it republishes after its own probes)", run: func(ctx context.Context, d *demo, node string) (string, error) {
		return "agent of " + node + " started and renewed its Lease", d.s.StartAgent(ctx, node)
	}},
	"restart-agent": {args: "NODE", help: "restart the agent of NODE: traffic must not change", run: func(ctx context.Context, d *demo, node string) (string, error) {
		return "agent of " + node + " restarted", d.s.RestartAgent(ctx, node)
	}},
	"roll-agents": {help: "replace every agent, one node at a time (a DaemonSet roll): traffic must not change", run: func(ctx context.Context, d *demo, _ string) (string, error) {
		return "every agent replaced", d.s.RollAgents(ctx)
	}},
	"delete-node": {args: "NODE", help: "delete the Node object (its agent stops): its slices go, traffic moves to the other node", run: func(ctx context.Context, d *demo, node string) (string, error) {
		return "Node " + node + " deleted", d.s.DeleteNode(ctx, node)
	}},
	"restart-leader": {help: "restart the controller replica that leads: the standby takes over", run: func(ctx context.Context, d *demo, _ string) (string, error) {
		oldL, newL, err := d.s.RestartLeader(ctx)
		return fmt.Sprintf("controller-%d restarted; controller-%d leads", oldL, newL), err
	}},
	"kubeconfig": {help: "print how to reach the API server with kubectl", run: func(_ context.Context, d *demo, _ string) (string, error) {
		// The client replaces {PID} with this process's PID as the host sees it.
		return fmt.Sprintf("kubeconfig: %s\nthe API server listens inside the demo's network namespace; from the host:\n"+
			"  nsenter -t {PID} -n -- kubectl --kubeconfig %s get swh,svc,endpointslices -n %s\n"+
			"  nsenter -t {PID} -n -- kubectl --kubeconfig %s get events -n %s\n"+
			"programs' logs: %s", d.kubeconfig, d.kubeconfig, demoNamespace, d.kubeconfig, demoNamespace, d.s.LogDir), nil
	}},
	"ping": {help: "check that the demo answers", run: func(context.Context, *demo, string) (string, error) { return "pong", nil }},
}

// needsArg tells whether a command takes an argument.
func (c command) needsArg() bool { return c.args != "" }

// helpText lists the commands.
func helpText() string {
	var b strings.Builder
	b.WriteString("commands (make run-ctl ARGS=\"COMMAND [NODE]\", or go run ./testkit/cmd/swh-run ctl COMMAND [NODE]):\n")
	// A fixed, readable order (TestHelpListsEveryCommand checks that none is missing).
	order := []string{"stop-smtp", "start-smtp", "wedge-smtp", "unwedge-smtp", "fail-web", "heal-web", "grpc-not-serving", "grpc-serving", "mysql-failover", "promote", "stop-agent", "start-agent", "restart-agent", "roll-agents", "delete-node", "restart-leader", "kubeconfig", "ping"}
	for _, n := range order {
		c := commands[n]
		fmt.Fprintf(&b, "  %-26s %s\n", strings.TrimSpace(n+" "+c.args), c.help)
	}
	b.WriteString("nodes: node-a, node-b")
	return b.String()
}

// promote promotes the replica and stops the old primary.
func (d *demo) promote(ctx context.Context) (string, error) {
	d.mu.Lock()
	if d.promoted {
		d.mu.Unlock()
		return "", errors.New("already done: db-1 is the primary and db-0 is stopped")
	}
	d.promoted = true
	d.mu.Unlock()
	if err := d.pg[1].Promote(ctx); err != nil {
		return "", err
	}
	if err := d.pg[0].Stop(ctx); err != nil {
		return "", err
	}
	d.mu.Lock()
	d.primary = 1
	d.stopped[0] = true
	d.mu.Unlock()
	return "db-1 promoted to primary; PostgreSQL in db-0 stopped", nil
}

// listen opens the control socket (owner only).
func (d *demo) listen() (net.Listener, error) {
	_ = os.Remove(d.cfg.Socket)
	ln, err := net.Listen("unix", d.cfg.Socket)
	if err != nil {
		return nil, fmt.Errorf("opening the control socket: %w", err)
	}
	if err := os.Chmod(d.cfg.Socket, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("restricting the control socket: %w", err)
	}
	return ln, nil
}

// serveControl answers control commands, one per connection, one at a time.
func (d *demo) serveControl(ctx context.Context, ln net.Listener) {
	go func() { <-ctx.Done(); _ = ln.Close() }()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		d.handle(ctx, conn)
	}
}

func (d *demo) handle(ctx context.Context, conn net.Conn) {
	defer func() { _ = conn.Close() }()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return
	}
	fields := strings.Fields(line)
	reply := func(s string) { _, _ = io.WriteString(conn, s+"\n") }
	if len(fields) == 0 || fields[0] == "help" {
		reply(d.help())
		return
	}
	cmd, ok := d.command(fields[0])
	switch {
	case !ok:
		reply(fmt.Sprintf("error: unknown command %q\n%s", fields[0], d.help()))
		return
	case cmd.needsArg() && len(fields) != 2:
		reply(fmt.Sprintf("error: %s needs %s", fields[0], cmd.args))
		return
	case !cmd.needsArg() && len(fields) != 1:
		reply(fmt.Sprintf("error: %s takes no argument", fields[0]))
		return
	}
	arg := ""
	if len(fields) == 2 {
		arg = fields[1]
	}
	cctx, cancel := context.WithTimeout(ctx, ctlTimeout)
	defer cancel()
	out, err := cmd.run(cctx, d, arg)
	if fields[0] != "kubeconfig" && fields[0] != "ping" {
		note := time.Now().Format("15:04:05") + " " + strings.Join(fields, " ") + ": "
		if err != nil {
			note += "FAILED: " + err.Error()
		} else {
			note += out
		}
		d.mu.Lock()
		d.notes = append(d.notes, note)
		if len(d.notes) > 5 {
			d.notes = d.notes[len(d.notes)-5:]
		}
		d.mu.Unlock()
	}
	if err != nil {
		reply("error: " + err.Error())
		return
	}
	reply(out)
}

// ctlRequest sends one command and returns the reply and the server's PID as this process's
// PID namespace sees it.
func ctlRequest(socket, line string) (reply string, err error) {
	conn, err := net.DialTimeout("unix", socket, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(ctlTimeout + 10*time.Second))
	pid := 0
	if uc, ok := conn.(*net.UnixConn); ok {
		if raw, err := uc.SyscallConn(); err == nil {
			_ = raw.Control(func(fd uintptr) {
				if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
					pid = int(cred.Pid)
				}
			})
		}
	}
	if _, err := io.WriteString(conn, line+"\n"); err != nil {
		return "", fmt.Errorf("sending the command: %w", err)
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		return "", fmt.Errorf("reading the reply: %w", err)
	}
	return strings.ReplaceAll(strings.TrimRight(string(b), "\n"), "{PID}", fmt.Sprint(pid)), nil
}

// runCtl is the client: `swh-run ctl COMMAND [ARG]`.
func runCtl(socket string, args []string, out io.Writer) error {
	if len(args) == 0 {
		args = []string{"help"}
	}
	if _, err := os.Stat(socket); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("cannot reach %s: permission denied (the demo runs as root: use sudo)", socket)
		}
		return fmt.Errorf("no demo is running: %s does not exist (start one with `make run`)", socket)
	}
	reply, err := ctlRequest(socket, strings.Join(args, " "))
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("cannot reach %s: permission denied (the demo runs as root: use sudo)", socket)
		}
		return fmt.Errorf("talking to the demo at %s: %w", socket, err)
	}
	if msg, ok := strings.CutPrefix(reply, "error: "); ok {
		return errors.New(msg)
	}
	_, _ = fmt.Fprintln(out, reply)
	return nil
}
