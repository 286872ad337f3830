package syncdir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"syscall"
	"testing"
)

// classifyFailure is the sender's decision after a failed request: a pure
// function of the error, the peer's answer read by its typed Reason.
func TestClassifyFailure(t *testing.T) {
	peer := func(status int, r Reason) error { return &httpError{status: status, reason: r, msg: "x"} }
	for _, c := range []struct {
		name string
		err  error
		want next
	}{
		{"local file vanished", fmt.Errorf("open: %w", fs.ErrNotExist), nextLookAgain},
		{"local ESTALE", syscall.ESTALE, nextPausePeer},
		{"no longer active", errNotActive, nextRequeue},
		{"stopping", fmt.Errorf("put: %w", context.Canceled), nextRequeue},
		{"changed while read", errSourceChanged, nextSourceChanged},
		{"peer saw it change", peer(409, ReasonSourceChanged), nextSourceChanged},
		{"rename source differs", peer(409, ReasonRenameSource), nextAsCopy},
		{"excluded there", peer(400, ReasonExcluded), nextGiveUp},
		{"bad path there", peer(400, ReasonTraversal), nextGiveUp},
		{"fenced: stale", peer(409, ReasonStaleEpoch), nextPausePeer},
		{"fenced: holding", peer(409, ReasonHolding), nextPausePeer},
		{"peer down", errors.New("dial tcp: connection refused"), nextPausePeer},
		{"peer disk full", peer(http.StatusInsufficientStorage, ""), nextRetry},
		{"peer error", peer(500, ""), nextRetry},
		{"too large", peer(413, ReasonTooLarge), nextRetry},
		{"peer's not-exist answer is not ours", &httpError{status: 500, msg: "no such file"}, nextRetry},
	} {
		if got := classifyFailure(c.err); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
