package syncdir

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
)

// The wire protocol: one HTTP/2 request per operation, the operation in the
// URL path, its arguments in the query, the fencing data in headers.
//
//	PUT  /v1/put/<root>?path=P&mode=0644&mtime=NS    body = content (Content-Length required)
//	PUT  /v1/put/<root>?path=P&mode=0644&mtime=NS&stream=1    body = content of a file
//	     still being written, length unknown; size and mtime follow in trailers
//	PUT  /v1/batch/<root>?n=N                   body = N small files, see batch.go
//	POST /v1/mkdir/<root>?path=P&mode=0755
//	POST /v1/delete/<root>?path=P
//	POST /v1/rename/<root>?path=P&to=Q
//	POST /v1/symlink/<root>?path=P&target=T
//	POST /v1/manifest/<root>                     body = JSON manifest
const (
	hdrEpoch = "X-Hapair-Epoch"
	hdrNode  = "X-Hapair-Node"
	hdrToken = "Authorization"
	// hdrCommit is a trailer of put: "ok" when the file did not change while
	// it was read; anything else makes the receiver discard the copy.
	hdrCommit     = "X-Hapair-Commit"
	commitOK      = "ok"
	commitChanged = "changed"
	// hdrSize and hdrMtime are trailers of a streamed put (stream=1): the
	// file's final size and mtime, known only once its writer is done.
	hdrSize  = "X-Hapair-Size"
	hdrMtime = "X-Hapair-Mtime"
)

// Reserved names: never synced, never accepted from the wire.
const (
	quarantineDir = ".hapair-quarantine"
	tempPrefix    = ".hapair-tmp-"
)

const (
	maxPathLen     = 4096
	maxNameLen     = 255
	maxManifest    = 256 << 20
	maxHeaderBytes = 64 << 10
)

type opKind string

const (
	opPut      opKind = "put"
	opMkdir    opKind = "mkdir"
	opDelete   opKind = "delete"
	opRename   opKind = "rename"
	opSymlink  opKind = "symlink"
	opManifest opKind = "manifest"
	opBatch    opKind = "batch"
)

// request is a decoded, validated wire request.
type request struct {
	op     opKind
	root   string
	path   string
	to     string // rename target
	target string // symlink target
	mode   uint32
	mtime  int64
	size   int64 // -1: streamed, the size comes in a trailer
	stream bool  // put of a file still being written
	count  int   // files in a batch
	epoch  int64
	node   string
	owner  bool // uid and gid were sent
	uid    uint32
	gid    uint32
}

// refusal is an error with a reason label for the rejected-requests metric.
type refusal struct {
	reason Reason
	status int
	msg    string
}

func (r *refusal) Error() string { return "syncdir: refused (" + string(r.reason) + "): " + r.msg }

func refuse(reason Reason, status int, format string, args ...any) error {
	return &refusal{reason: reason, status: status, msg: fmt.Sprintf(format, args...)}
}

// decodeRequest validates everything about r except authentication and the
// fence, without touching the file system.
func decodeRequest(r *http.Request) (request, error) {
	var q request
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/")
	if !ok {
		return q, refuse(ReasonBadRequest, http.StatusNotFound, "unknown endpoint %q", r.URL.Path)
	}
	op, root, ok := strings.Cut(rest, "/")
	if !ok || !validRootName(root) {
		return q, refuse(ReasonBadRequest, http.StatusNotFound, "unknown endpoint %q", r.URL.Path)
	}
	q.op, q.root = opKind(op), root
	want := http.MethodPost
	switch q.op {
	case opPut, opBatch:
		want = http.MethodPut
	case opMkdir, opDelete, opRename, opSymlink, opManifest:
	default:
		return q, refuse(ReasonBadRequest, http.StatusNotFound, "unknown operation %q", op)
	}
	if r.Method != want {
		return q, refuse(ReasonBadRequest, http.StatusMethodNotAllowed, "%s needs %s", op, want)
	}
	if err := decodeFence(r, &q); err != nil {
		return q, err
	}
	v, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return q, refuse(ReasonBadRequest, http.StatusBadRequest, "bad query: %v", err)
	}
	for k, vs := range v {
		if len(vs) != 1 {
			return q, refuse(ReasonBadRequest, http.StatusBadRequest, "parameter %q given %d times", k, len(vs))
		}
	}
	if q.op == opBatch {
		return q, decodeBatchArgs(v, &q)
	}
	if q.op == opPut {
		switch s := v.Get("stream"); {
		case s == "1":
			q.stream, q.size = true, -1
		case s != "":
			return q, refuse(ReasonBadRequest, http.StatusBadRequest, "bad stream %q", s)
		case r.ContentLength < 0:
			return q, refuse(ReasonBadRequest, http.StatusLengthRequired, "put needs Content-Length")
		default:
			q.size = r.ContentLength
		}
	}
	return q, decodeArgs(v, &q)
}

func decodeFence(r *http.Request, q *request) error {
	e := r.Header.Values(hdrEpoch)
	if len(e) != 1 {
		return refuse(ReasonNoEpoch, http.StatusBadRequest, "exactly one %s header required", hdrEpoch)
	}
	n, ok := parseEpoch(e[0])
	if !ok {
		return refuse(ReasonNoEpoch, http.StatusBadRequest, "bad %s %q", hdrEpoch, e[0])
	}
	q.epoch = n
	nodes := r.Header.Values(hdrNode)
	if len(nodes) != 1 || !validNode(nodes[0]) {
		return refuse(ReasonNoNode, http.StatusBadRequest, "exactly one valid %s header required", hdrNode)
	}
	q.node = nodes[0]
	return nil
}

// parseEpoch accepts only the canonical decimal form of a positive epoch:
// digits, no sign, no leading zero, no spaces, within int64. Anything
// else ("+10", "010", "-1", "0") is not an epoch any sender writes, and
// two spellings of one number must not exist on a fencing header.
func parseEpoch(s string) (int64, bool) {
	if s == "" || len(s) > 19 || s[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// decodeArgs reads the arguments of one operation from v: the query of a
// request, or the header of one file in a batch.
func decodeArgs(v url.Values, q *request) error {
	if q.op == opManifest {
		if len(v) != 0 {
			return refuse(ReasonBadRequest, http.StatusBadRequest, "manifest takes no parameters")
		}
		return nil
	}
	var err error
	if q.path, err = checkPath(v.Get("path")); err != nil {
		return err
	}
	allowed := map[string]bool{"path": true}
	if q.op == opPut || q.op == opMkdir || q.op == opSymlink {
		allowed["uid"], allowed["gid"] = true, true
		if err := decodeOwner(v, q); err != nil {
			return err
		}
	}
	switch q.op {
	case opPut:
		allowed["mode"], allowed["mtime"] = true, true
		allowed["stream"] = q.stream
		if q.mode, err = parseMode(v.Get("mode")); err != nil {
			return err
		}
		if q.mtime, err = strconv.ParseInt(v.Get("mtime"), 10, 64); err != nil {
			return refuse(ReasonBadRequest, http.StatusBadRequest, "bad mtime %q", v.Get("mtime"))
		}
	case opMkdir:
		allowed["mode"] = true
		if q.mode, err = parseMode(v.Get("mode")); err != nil {
			return err
		}
	case opRename:
		allowed["to"] = true
		if q.to, err = checkPath(v.Get("to")); err != nil {
			return err
		}
	case opSymlink:
		allowed["target"] = true
		q.target = v.Get("target")
		if q.target == "" || len(q.target) > maxPathLen || strings.IndexByte(q.target, 0) >= 0 {
			return refuse(ReasonBadPath, http.StatusBadRequest, "bad symlink target")
		}
	}
	for k := range v {
		if !allowed[k] {
			return refuse(ReasonBadRequest, http.StatusBadRequest, "unknown parameter %q", k)
		}
	}
	return nil
}

// decodeOwner reads the optional uid and gid (both or neither).
func decodeOwner(v url.Values, q *request) error {
	u, g := v.Get("uid"), v.Get("gid")
	if u == "" && g == "" {
		return nil
	}
	uid, err1 := strconv.ParseUint(u, 10, 32)
	gid, err2 := strconv.ParseUint(g, 10, 32)
	if err1 != nil || err2 != nil {
		return refuse(ReasonBadRequest, http.StatusBadRequest, "bad uid/gid %q/%q", u, g)
	}
	q.owner, q.uid, q.gid = true, uint32(uid), uint32(gid)
	return nil
}

func parseMode(s string) (uint32, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, refuse(ReasonBadRequest, http.StatusBadRequest, "bad mode %q", s)
	}
	return uint32(m), nil
}

// checkPath accepts only a clean, relative, slash-separated path that stays
// inside the root and avoids reserved names. The query is decoded exactly
// once, so "%2e%2e" arrives here as ".." and is refused; "%252e" arrives as
// the literal name "%2e", which is harmless.
func checkPath(p string) (string, error) {
	switch {
	case p == "" || p == ".":
		return "", refuse(ReasonBadPath, http.StatusBadRequest, "empty path")
	case strings.IndexByte(p, 0) >= 0:
		return "", refuse(ReasonNUL, http.StatusBadRequest, "NUL byte in path")
	case len(p) > maxPathLen:
		return "", refuse(ReasonBadPath, http.StatusBadRequest, "path longer than %d bytes", maxPathLen)
	case strings.HasPrefix(p, "/"):
		return "", refuse(ReasonAbsolute, http.StatusBadRequest, "absolute path %q", p)
	}
	for _, c := range strings.Split(p, "/") {
		switch {
		case c == "..":
			return "", refuse(ReasonTraversal, http.StatusBadRequest, "'..' in path %q", p)
		case c == "" || c == ".":
			return "", refuse(ReasonBadPath, http.StatusBadRequest, "path %q is not clean", p)
		case len(c) > maxNameLen:
			return "", refuse(ReasonBadPath, http.StatusBadRequest, "name longer than %d bytes", maxNameLen)
		case strings.HasPrefix(c, tempPrefix):
			return "", refuse(ReasonReserved, http.StatusBadRequest, "reserved name %q", c)
		}
	}
	if path.Clean(p) != p {
		return "", refuse(ReasonBadPath, http.StatusBadRequest, "path %q is not clean", p)
	}
	if first, _, _ := strings.Cut(p, "/"); first == quarantineDir {
		return "", refuse(ReasonReserved, http.StatusBadRequest, "path %q is inside the quarantine", p)
	}
	return p, nil
}

// errNotActive stops the sender: the fence says this node may not push.
var errNotActive = errors.New("syncdir: not active")
