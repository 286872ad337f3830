package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ModuleRoot finds the hapair module's root from dir upwards.
func ModuleRoot(dir string) (string, error) {
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/hapair/hapair")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("hapair module root (go.mod) not found")
		}
		dir = parent
	}
}

// Build compiles the project's binaries into outDir. A part that does not
// build yet is reported and left out; the lab runs without it.
func Build(ctx context.Context, modRoot, outDir string, out io.Writer) (built, failed []string) {
	_ = os.MkdirAll(outDir, 0o755)
	for _, b := range []string{BinWitness, BinRoled, BinLB, BinCtl} {
		if _, err := os.Stat(filepath.Join(modRoot, "cmd", b)); err != nil {
			failed = append(failed, b+" (no cmd/"+b+")")
			continue
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(outDir, b), "./cmd/"+b)
		cmd.Dir = modRoot
		msg, err := cmd.CombinedOutput()
		if err != nil {
			_ = os.Remove(filepath.Join(outDir, b))
			first := strings.SplitN(strings.TrimSpace(string(msg)), "\n", 3)
			fmt.Fprintf(out, "build %s failed: %s\n", b, strings.Join(first, " | "))
			failed = append(failed, b)
			continue
		}
		built = append(built, b)
	}
	return built, failed
}

// BuildSelf compiles the hapair-lab binary itself (tests need it for the app
// and the fallback etcd member).
func BuildSelf(ctx context.Context, modRoot, outDir string) (string, error) {
	p := filepath.Join(outDir, "hapair-lab")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", p, "./lab/cmd/hapair-lab")
	cmd.Dir = modRoot
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build hapair-lab: %w: %s", err, msg)
	}
	return p, nil
}
