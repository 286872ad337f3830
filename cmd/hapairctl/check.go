package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/hapair/hapair/roled"
)

func init() {
	register(command{name: "check", summary: "exit 0 only when the local roled is ACTIVE (keepalived vrrp_script, cron guards)", run: runCheck})
}

// runCheck asks the local roled's /role. Exit 0: ACTIVE; 1: PASSIVE or roled
// unreachable (with a message); 2: usage.
func runCheck(ctx context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	var f ctlFlags
	f.bind(fs)
	url := fs.String("url", "", "roled base URL (default: roled from the config, http://127.0.0.1:7400)")
	timeout := fs.Duration("timeout", 2*time.Second, "request timeout")
	quiet := fs.Bool("q", false, "print nothing on success or PASSIVE")
	if code, ok := parseFlags(fs, e, args); !ok {
		return code
	}
	base := *url
	if base == "" {
		cfg, err := f.load()
		if err != nil {
			e.errorf("check", "%v", err)
			return 2
		}
		base = cfg.Roled
	}
	st, err := fetchRole(ctx, strings.TrimSuffix(base, "/"), *timeout)
	if err != nil {
		e.errorf("check", "%v", err)
		return 1
	}
	if st.Role != "active" {
		if !*quiet {
			fmt.Fprintf(e.stdout, "%s is %s (%s)\n", st.Node, st.Role, st.Reason)
		}
		return 1
	}
	if !*quiet {
		fmt.Fprintf(e.stdout, "%s is active (epoch %d)\n", st.Node, st.Epoch)
	}
	return 0
}

func fetchRole(ctx context.Context, base string, timeout time.Duration) (roled.Status, error) {
	var st roled.Status
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/role", nil)
	if err != nil {
		return st, fmt.Errorf("roled url %q: %w", base, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("cannot reach roled: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("roled %s/role: %s", base, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return st, fmt.Errorf("roled %s/role: %w", base, err)
	}
	return st, nil
}
