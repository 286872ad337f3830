package lb

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
)

// Chunked bodies are decoded strictly and written out again in our own
// framing, never relayed as received. Why: a proxy that copies the client's
// framing forwards whatever it did not look at (the two bytes after chunk
// data, a bare LF in a size line or an extension, a trailer ending CR CR LF),
// and a backend that reads those bytes differently sees a different message
// boundary: a smuggled request (issue 15). What the backend receives is
// canonical: hex sizes, CRLF everywhere, no extensions, no trailers.
//
// The rules are those of Go's net/http chunked reader (the reference of the
// differential fuzz test), so both engines accept and refuse the same
// bodies:
//   - a chunk line ends in CR LF; a bare LF, or a CR anywhere before the
//     end, is refused (RFC 9112 erratum 7633: no bare LF in chunk lines);
//   - the size is 1 to 16 hex digits, leading zeros allowed, followed by
//     optional spaces/tabs and an optional ";extension" (dropped);
//   - the chunk's data is followed by exactly CR LF;
//   - the trailer section is parsed as header fields (same rules as a
//     head: token name, no space before the colon, no obs-fold, no control
//     bytes in values, CR LF line ends) and dropped;
//   - at most maxChunkOverhead bytes of framing beyond what the data
//     justifies (tiny chunks with long extensions), as net/http.

const (
	maxChunkLine     = 4096     // bytes in one chunk-size line, as net/http
	maxChunkOverhead = 16 << 10 // framing allowed beyond 16 B per chunk and twice the data
	maxTrailerBytes  = 8 << 10  // trailer section
)

var (
	// errFraming: the message's framing is invalid (answered with 400 when
	// it is the client's, 502 when the backend's).
	errFraming = fmt.Errorf("%w: framing", errMalformed)
	// errDstWrite marks a failure to write the decoded body onward, as
	// opposed to reading it (the client's fault, or the backend's).
	errDstWrite = errors.New("lb: writing body")
)

// copyChunked reads one chunked body from src, checking every byte of its
// framing, and writes it to dst: re-encoded as chunked (reencode), or as
// plain data for a close-delimited HTTP/1.0 reader. On success src is
// positioned just after the message (trailers included). With flush, dst
// is flushed whenever src has nothing buffered (a stream stays live).
func copyChunked(dst *wbuf, src *bufio.Reader, reencode, flush bool) error {
	var excess int64
	var hex [16]byte
	for {
		line, err := readChunkLine(src)
		if err != nil {
			return err
		}
		size, ok := parseChunkSize(line)
		if !ok {
			return errFraming
		}
		excess += int64(len(line)) + 2 - 16 - 2*size // net/http's sum
		excess = max(excess, 0)
		if excess > maxChunkOverhead {
			return errFraming
		}
		if size == 0 {
			if err := skipTrailers(src); err != nil {
				return err
			}
			if reencode {
				if _, err := dst.WriteString("0\r\n\r\n"); err != nil {
					return errors.Join(errDstWrite, err)
				}
			}
			return nil
		}
		if reencode {
			_, _ = dst.Write(strconv.AppendInt(hex[:0], size, 16))
			if _, err := dst.WriteString("\r\n"); err != nil {
				return errors.Join(errDstWrite, err)
			}
		}
		if err := copyN(dst, src, size); err != nil {
			return err
		}
		crlf, err := src.Peek(2)
		if err != nil {
			return eofUnexpected(err)
		}
		if crlf[0] != '\r' || crlf[1] != '\n' {
			return errFraming
		}
		_, _ = src.Discard(2)
		if reencode {
			if _, err := dst.WriteString("\r\n"); err != nil {
				return errors.Join(errDstWrite, err)
			}
		}
		if flush && src.Buffered() == 0 {
			if err := dst.Flush(); err != nil {
				return errors.Join(errDstWrite, err)
			}
		}
	}
}

// readChunkLine returns one line of chunk framing without its CR LF.
func readChunkLine(src *bufio.Reader) ([]byte, error) {
	line, err := src.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errFraming
		}
		return nil, eofUnexpected(err)
	}
	n := len(line)
	if n < 2 || line[n-2] != '\r' || bytes.IndexByte(line[:n-2], '\r') >= 0 || n-2 >= maxChunkLine {
		return nil, errFraming // bare LF, bare CR, or too long
	}
	return line[:n-2], nil
}

// parseChunkSize parses "hex [SP|HTAB]* [; extension]" (net/http's rule:
// trailing blanks trimmed, the extension cut at the first ';', the rest
// all hex).
func parseChunkSize(line []byte) (int64, bool) {
	for n := len(line); n > 0 && (line[n-1] == ' ' || line[n-1] == '\t'); n-- {
		line = line[:n-1]
	}
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	if len(line) == 0 || len(line) > 16 {
		return 0, false
	}
	var n uint64
	for _, c := range line {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		n = n<<4 | uint64(d)
	}
	if n > 1<<62 {
		return 0, false // no body is that long; keeps the size arithmetic in int64
	}
	return int64(n), true
}

// skipTrailers reads the trailer section up to its blank line, validating
// each field as a head's field, and drops it: trailers are not forwarded.
func skipTrailers(src *bufio.Reader) error {
	total := 0
	for {
		line, err := src.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return errFraming
			}
			return eofUnexpected(err)
		}
		total += len(line)
		n := len(line)
		if n < 2 || line[n-2] != '\r' || total > maxTrailerBytes {
			return errFraming // bare LF (also CR CR LF: a CR in the line) or too long
		}
		line = line[:n-2]
		if len(line) == 0 {
			return nil
		}
		if _, _, ok := parseFieldLine(line); !ok {
			return errFraming
		}
	}
}

// eofUnexpected: a body that ends before its framing does is truncated.
func eofUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// bodyErrorStatus is the answer to a client whose request body failed:
// 400 for invalid framing, 408 for a body that stalled past
// client-body-timeout, 0 (just close) for a client that went away.
func bodyErrorStatus(err error) int {
	var ne net.Error
	switch {
	case errors.Is(err, errMalformed):
		return 400
	case errors.As(err, &ne) && ne.Timeout():
		return 408
	}
	return 0
}
