// Package pgtest runs a throw-away PostgreSQL 15 (Debian's postgresql-15)
// for tests that need the real server: roled's recovery and refusal checks,
// the balancer's TCP routing. As root it runs the server as user postgres
// (setpriv execs directly, as LAB.md §8 recommends); everything is stopped
// and removed at test cleanup.
package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Bin is where Debian installs PostgreSQL 15's server programs.
const Bin = "/usr/lib/postgresql/15/bin"

// Server is one PostgreSQL cluster: a data directory and the server on it.
type Server struct {
	Dir  string // private directory: data/, the socket, the log
	Data string
	Sock string // unix socket directory
	Port int    // TCP port on 127.0.0.1 (and the socket's number)

	asUser *user.User // nil: run as ourselves
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
func (s *Server) cmd(bin string, args ...string) *exec.Cmd {
	path := filepath.Join(Bin, bin)
	if s.asUser == nil {
		return exec.Command(path, args...)
	}
	full := append([]string{"--reuid=postgres", "--regid=postgres", "--init-groups", path}, args...)
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
		opts := fmt.Sprintf("-k %s -p %d -c listen_addresses=127.0.0.1 -c fsync=off -c shared_buffers=16MB -c max_connections=30", s.Sock, s.Port)
		err = s.Run("pg_ctl", "-D", s.Data, "-o", opts, "-l", filepath.Join(s.Dir, "log"), "-w", "-t", "60", "start")
		if err == nil || !s.portTaken() {
			return err
		}
	}
	return err
}

// portTaken reports whether the last start failed to bind its port.
func (s *Server) portTaken() bool {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "log"))
	return strings.Contains(string(b), "could not bind")
}

// Stop stops the server (fast shutdown) and waits for it.
func (s *Server) Stop() error { return s.Run("pg_ctl", "-D", s.Data, "-m", "fast", "-w", "stop") }

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
