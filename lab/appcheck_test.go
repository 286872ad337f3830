package lab

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/hapair/hapair/internal/pgtest"
)

// TestAppCheck: /check (hapairctl drill's lb.check-path) answers 200 for a
// write whose row and file are on the node, 404 naming what is missing.
func TestAppCheck(t *testing.T) {
	pgtest.Require(t)
	pg, err := pgtest.New(t)
	if err != nil {
		t.Fatal(err)
	}
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=1", pg.Port)
	a := &App{node: "nodea", dir: t.TempDir(), dsn: dsn, conns: make(chan *pgx.Conn, 4), slots: make(chan struct{}, 4)}
	t.Cleanup(a.drain)
	mux := http.NewServeMux()
	mux.HandleFunc("/write", a.write)
	mux.HandleFunc("/check", a.check)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	do := func(method, path string) (int, CheckResult) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var res CheckResult
		_ = json.NewDecoder(resp.Body).Decode(&res)
		return resp.StatusCode, res
	}
	if code, _ := do(http.MethodPost, "/write?id=1"); code != http.StatusOK {
		t.Fatalf("write: %d", code)
	}
	if code, res := do(http.MethodGet, "/check?id=1"); code != http.StatusOK || !res.Row || !res.File || res.Node != "nodea" {
		t.Errorf("check of a write present: %d %+v", code, res)
	}
	if code, res := do(http.MethodGet, "/check?id=2"); code != http.StatusNotFound || res.Row || res.File {
		t.Errorf("check of a write never made: %d %+v", code, res)
	}
	if err := os.Remove(filepath.Join(a.dir, "w", "1.txt")); err != nil {
		t.Fatal(err)
	}
	if code, res := do(http.MethodGet, "/check?id=1"); code != http.StatusNotFound || !res.Row || res.File {
		t.Errorf("check of a write whose file is missing: %d %+v", code, res)
	}
	if code, _ := do(http.MethodGet, "/check?id=x"); code != http.StatusBadRequest {
		t.Errorf("check without an id: %d", code)
	}
}
