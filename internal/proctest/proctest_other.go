//go:build !linux

package proctest

import "os/exec"

func dieWithTest(*exec.Cmd) {}
