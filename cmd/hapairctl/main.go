// Command hapairctl is the operator's tool for a hapair cluster. Each
// subcommand lives in its own file and registers itself in init() with one
// call to register.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/hapair/hapair/internal/daemon"
)

// command is one subcommand. run returns the process exit code.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, e *env, args []string) int
}

// env is what a subcommand may use besides its arguments.
type env struct {
	stdin          io.Reader // nil: no terminal, questions are answered no
	stdout, stderr io.Writer
}

// errorf prints a message prefixed with the program and subcommand name.
func (e *env) errorf(cmd, format string, args ...any) {
	fmt.Fprintf(e.stderr, "hapairctl %s: %s\n", cmd, fmt.Sprintf(format, args...))
}

var commands = map[string]command{}

// register adds a subcommand; called from init() in the subcommand's file.
func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("hapairctl: duplicate subcommand " + c.name)
	}
	commands[c.name] = c
}

func main() {
	ctx, stop := daemon.SignalContext()
	code := run(ctx, &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr}, os.Args[1:])
	stop()
	os.Exit(code)
}

// run dispatches to a subcommand. Exit codes: 0 success, 1 failure (or "no"
// for check), 2 usage or configuration error.
func run(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(e.stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "version" {
		fmt.Fprintln(e.stdout, "hapairctl", daemon.Version)
		return 0
	}
	if isCheckConfig(args) {
		return runCheckConfig(e, args)
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "hapairctl: unknown command %q\n", args[0])
		usage(e.stderr)
		return 2
	}
	return c.run(ctx, e, args[1:])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: hapairctl COMMAND [flags]   (hapairctl COMMAND -h for its flags)")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, commands[n].summary)
	}
}
