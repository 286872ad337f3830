// Package proctest ties the processes a test starts to the test binary's
// life.
//
// Why: a test's cleanups stop what it started, but they do not run when the
// test binary itself dies: `go test -timeout` panics and exits, and a CI
// runner or an operator may kill it. Three hapair-witness members of a
// killed run once stayed up for most of an hour, holding their ports and
// loading the machine under the next run's timings.
package proctest

import "os/exec"

// DieWithTest makes cmd's process receive SIGKILL when the test binary
// dies, however it dies (Linux: the parent-death signal; elsewhere nothing).
// Call it before cmd.Start.
//
// The signal follows the thread that started the process, not only the
// process: start it from a goroutine that has not locked its OS thread
// (runtime.LockOSThread, as network-namespace code does), or it dies with
// that goroutine. The setting survives exec of an ordinary binary (a
// wrapper such as nsenter or systemd-socket-activate passes it on) but not
// a change of user (setpriv) or a fork: a daemon that detaches (pg_ctl) is
// not covered.
func DieWithTest(cmd *exec.Cmd) { dieWithTest(cmd) }
