package syncdir

// Reason is why the receiver refused a request (or one file of a batch).
// It travels in the JSON answer ("reason"), labels
// hapair_sync_rejected_total and Status().Rejected, and the sender
// classifies failures by it: both sides use these constants, never
// string literals.
type Reason string

// errorBody is the JSON answer of a refused or failed request.
type errorBody struct {
	Error  string `json:"error"`
	Reason Reason `json:"reason"`
}

const (
	ReasonAuth          Reason = "auth"           // missing or wrong bearer token
	ReasonTLS           Reason = "tls"            // TLS handshake refused (counted only)
	ReasonBadRequest    Reason = "bad-request"    // malformed request or body
	ReasonBadPath       Reason = "bad-path"       // empty, unclean or over-long path
	ReasonAbsolute      Reason = "absolute"       // absolute path
	ReasonTraversal     Reason = "traversal"      // ".." in a path
	ReasonNUL           Reason = "nul"            // NUL byte in a path
	ReasonReserved      Reason = "reserved"       // the quarantine or a temp name
	ReasonSymlinkParent Reason = "symlink-parent" // a directory of the path is a link
	ReasonExcluded      Reason = "excluded"       // excluded on the receiver
	ReasonUnknownRoot   Reason = "unknown-root"   // no such root here
	ReasonNoEpoch       Reason = "no-epoch"       // missing or malformed epoch header
	ReasonNoNode        Reason = "no-node"        // missing or malformed node header
	ReasonStaleEpoch    Reason = "stale-epoch"    // epoch below the highest recorded (409)
	ReasonHolding       Reason = "holding"        // the receiving node is (becoming) ACTIVE (409)
	ReasonTooLarge      Reason = "too-large"      // body over a bound (413)
	ReasonRenameSource  Reason = "rename-source"  // rename source missing or not as synced (409)
	ReasonSourceChanged Reason = "source-changed" // the file changed while it was sent (409)
	ReasonSkipped       Reason = "skipped"        // a batch entry the sender skipped (204)
)
