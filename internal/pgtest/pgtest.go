// Package pgtest runs a throw-away PostgreSQL 15 (Debian's postgresql-15)
// for tests that need the real server: roled's recovery and refusal checks,
// the balancer's TCP routing. As root it runs the server as user postgres
// (setpriv execs directly, as LAB.md §8 recommends); everything is stopped
// and removed at test cleanup.
//
// The server runs in the foreground as this process's child, not detached
// by pg_ctl: it is killed with the test binary however that dies (a
// `go test -timeout`, a killed run), which would skip the cleanup.
package pgtest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/proctest"
)

// Bin is where Debian installs PostgreSQL 15's server programs.
const Bin = "/usr/lib/postgresql/15/bin"

// Server is one PostgreSQL cluster: a data directory and the server on it.
type Server struct {
	Dir  string // private directory: data/, the socket, the log
	Data string
	Sock string // unix socket directory
	Port int    // TCP port on 127.0.0.1 (and the socket's number)

	asUser *user.User    // nil: run as ourselves
	exited chan struct{} // of the last postmaster started; closed once reaped
}

// Require skips t when PostgreSQL 15 cannot be run here.
func Require(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(Bin, "initdb")); err != nil {
		t.Skip("PostgreSQL 15 not installed (Debian package postgresql-15)")
	}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			t.Skip("running as root without a postgres user (Debian package postgresql-15)")
		}
	}
}

// New creates and starts a cluster. It returns errors rather than failing
// t, so that several can be started from goroutines; call Require first.
func New(t testing.TB) (*Server, error) {
	dir, err := os.MkdirTemp("", "hapair-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, Data: filepath.Join(dir, "data"), Sock: filepath.Join(dir, "sock")}
	t.Cleanup(func() {
		_ = s.cmd("pg_ctl", "-D", s.Data, "-m", "immediate", "-w", "stop").Run()
		os.RemoveAll(dir)
	})
	if err := s.prepareDirs(); err != nil {
		return nil, err
	}
	if err := s.Run("initdb", "-D", s.Data, "-U", "postgres", "-A", "trust", "-N", "--locale=C.UTF-8", "-E", "UTF8"); err != nil {
		return nil, err
	}
	return s, s.Start()
}

// prepareDirs makes the directory and socket directory, owned by postgres
// when the server will run as postgres.
func (s *Server) prepareDirs() error {
	if err := os.Mkdir(s.Sock, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(s.Dir, 0o755); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return err
	}
	s.asUser = u
	for _, d := range []string{s.Dir, s.Sock} {
		if err := s.chown(d); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) chown(path string) error {
	if s.asUser == nil {
		return nil
	}
	uid, _ := strconv.Atoi(s.asUser.Uid)
	gid, _ := strconv.Atoi(s.asUser.Gid)
	return os.Chown(path, uid, gid)
}

// cmd prepares a PostgreSQL program, as postgres via setpriv when root.
func (s *Server) cmd(bin string, args ...string) *exec.Cmd { return s.command(bin, nil, args...) }

// command is cmd with extra setpriv options (used when root only).
func (s *Server) command(bin string, setprivOpts []string, args ...string) *exec.Cmd {
	path := filepath.Join(Bin, bin)
	if s.asUser == nil {
		return exec.Command(path, args...)
	}
	full := append(append([]string{"--reuid=postgres", "--regid=postgres", "--init-groups"}, setprivOpts...), path)
	full = append(full, args...)
	c := exec.Command("setpriv", full...)
	c.Env = []string{"HOME=" + s.asUser.HomeDir, "USER=postgres", "LOGNAME=postgres", "PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	return c
}

// Run runs a PostgreSQL program (initdb, pg_ctl, ...) to completion.
func (s *Server) Run(bin string, args ...string) error {
	if out, err := s.cmd(bin, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v: %w\n%s", bin, args, err, out)
	}
	return nil
}

// Start starts the server and waits until it accepts connections. A port
// taken between choosing and binding it is answered with another port.
func (s *Server) Start() error {
	var err error
	for try := 0; try < 3; try++ {
		if s.Port == 0 || try > 0 {
			if s.Port, err = freePort(); err != nil {
				return err
			}
		}
		err = s.startOnce()
		if err == nil || !s.portTaken() {
			return err
		}
	}
	return err
}

// startOnce runs the postmaster as a child that dies with the test binary
// (proctest; setpriv sets the signal again after it changes user, which
// clears it) and waits, as pg_ctl -w does, for postmaster.pid to say ready
// (or standby, for a server in recovery).
func (s *Server) startOnce() error {
	logf, err := os.OpenFile(filepath.Join(s.Dir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own copy
	cmd := s.command("postgres", []string{"--pdeathsig=KILL"}, "-D", s.Data, "-k", s.Sock, "-p", strconv.Itoa(s.Port),
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "shared_buffers=16MB", "-c", "max_connections=30")
	cmd.Stdout, cmd.Stderr = logf, logf
	proctest.DieWithTest(cmd)
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	s.exited = exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(60 * time.Second)
	for {
		if s.ready(cmd.Process.Pid) {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("postgres exited before it was ready (log %s):\n%s", filepath.Join(s.Dir, "log"), s.logTail())
		case <-deadline:
			_ = cmd.Process.Kill()
			<-exited
			return errors.New("postgres not ready after 60s:\n" + s.logTail())
		case <-tick.C:
		}
	}
}

// ready reads postmaster.pid: written by pid (setpriv execs postgres, so
// the same process; a file left by a killed server names another) and its
// status line, the 8th, ready or standby.
func (s *Server) ready(pid int) bool {
	b, err := os.ReadFile(filepath.Join(s.Data, "postmaster.pid"))
	if err != nil {
		return false
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 8 || strings.TrimSpace(lines[0]) != strconv.Itoa(pid) {
		return false
	}
	st := strings.TrimSpace(lines[7])
	return st == "ready" || st == "standby"
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// portTaken reports whether the last start failed to bind its port.
func (s *Server) portTaken() bool {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "log"))
	return strings.Contains(string(b), "could not bind")
}

// Stop stops the server (fast shutdown) and waits for it to exit.
func (s *Server) Stop() error {
	if err := s.Run("pg_ctl", "-D", s.Data, "-m", "fast", "-w", "stop"); err != nil {
		return err
	}
	if s.exited != nil {
		// pg_ctl saw postmaster.pid go, which the postmaster removes as it
		// exits; a bound, not a timing.
		select {
		case <-s.exited:
		case <-time.After(60 * time.Second):
			return errors.New("postgres still running 60s after pg_ctl stop")
		}
	}
	return nil
}

// Standby makes the next Start come up in recovery.
func (s *Server) Standby() error {
	f := filepath.Join(s.Data, "standby.signal")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		return err
	}
	return s.chown(f)
}

// Promote ends recovery and waits for it.
func (s *Server) Promote() error { return s.Run("pg_ctl", "-D", s.Data, "-w", "promote") }

// SocketDSN connects over the unix socket (libpq key/value form).
func (s *Server) SocketDSN() string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", s.Sock, s.Port)
}

// TCPDSN connects over TCP to 127.0.0.1.
func (s *Server) TCPDSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", s.Port)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
