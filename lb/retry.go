package lb

// The retry rule of both HTTP engines (the lean one with its event loop,
// and net/http's), in one pure function so that a new path cannot grow its
// own copy (DESIGN.md §5): a request already sent to a backend is never
// sent again unless it is idempotent (RFC 9110 §9.2.2), has no body, and
// no response byte came back. A request with a body is not replayable even
// when idempotent: its body was read from the client once and is gone, so
// a replay would send another body (the client's next bytes) or none.

// retryAction is what to do after an attempt.
type retryAction uint8

const (
	retryStop  retryAction = iota // answer the client with this attempt's result
	retryFresh                    // same server, a new connection; not counted as a retry
	retryNext                     // another server; counts against retries
)

func (a retryAction) String() string {
	switch a {
	case retryStop:
		return "stop"
	case retryFresh:
		return "fresh"
	case retryNext:
		return "next"
	}
	return "unknown"
}

// retryReason says why.
type retryReason uint8

const (
	reasonDone            retryReason = iota // the response was relayed
	reasonAborted                            // the response had started to reach the client
	reasonClientBody                         // the client's own body failed
	reasonResponseStarted                    // response bytes came back (then failed)
	reasonNotReplayable                      // sent, no response, but not idempotent or with a body
	reasonStalePooled                        // a pooled connection had gone stale: replay on a new one
	reasonNotSent                            // nothing reached the server (connect failed)
	reasonReplayable                         // sent, no response byte, idempotent without a body
	reasonNoBudget                           // retryable, but the retries are used up
)

func (r retryReason) String() string {
	switch r {
	case reasonDone:
		return "done"
	case reasonAborted:
		return "aborted"
	case reasonClientBody:
		return "client-body"
	case reasonResponseStarted:
		return "response-started"
	case reasonNotReplayable:
		return "not-replayable"
	case reasonStalePooled:
		return "stale-pooled"
	case reasonNotSent:
		return "not-sent"
	case reasonReplayable:
		return "replayable"
	case reasonNoBudget:
		return "no-budget"
	}
	return "unknown"
}

// attemptResult is what decideRetry looks at.
type attemptResult struct {
	out     outcome
	reused  bool // the connection came from the pool (only the attempt's own loop passes it)
	idem    bool // the method is idempotent
	hasBody bool // the request has a body (Content-Length > 0 or chunked)
	attempt int  // attempts made on other servers before this one
	retries int  // the backend's retries
}

// replayable: a request that may be sent a second time.
func replayable(idem, hasBody bool) bool { return idem && !hasBody }

// decideRetry is the retry rule (see the top of this file).
func decideRetry(a attemptResult) (retryAction, retryReason) {
	switch a.out {
	case outDone:
		return retryStop, reasonDone
	case outAborted:
		return retryStop, reasonAborted
	case outBadRequest:
		return retryStop, reasonClientBody
	case outFailed:
		return retryStop, reasonResponseStarted
	case outNotSent:
		if a.attempt >= a.retries {
			return retryStop, reasonNoBudget
		}
		return retryNext, reasonNotSent
	}
	// outNoResponse
	if !replayable(a.idem, a.hasBody) {
		return retryStop, reasonNotReplayable
	}
	if a.reused {
		return retryFresh, reasonStalePooled
	}
	if a.attempt >= a.retries {
		return retryStop, reasonNoBudget
	}
	return retryNext, reasonReplayable
}
