package replica

import (
	"errors"
	"fmt"
)

// FullHeader is the response header with which a replica refuses a request
// because it is at its max_ongoing_requests: a 503 carrying "FullHeader: 1"
// means "over the limit, try another replica", never a failure (issue 5).
// Replica hosts of this project send it; any HTTP server may.
const FullHeader = "X-Serve-Replica-Full"

// The errors below are what Upstream.Serve returns when the request failed
// at or before the replica; a context error means the client left (or the
// proxy's own deadline passed) instead. None of them unwraps: a dial or
// read timeout deep inside must not look like context.DeadlineExceeded,
// which is the proxy's own deadline (408), never the replica's (504). Err
// holds the cause for logs.

// UnreachableError is a replica that could not be reached, or whose
// connection broke before it began its answer. The proxy answers 502.
type UnreachableError struct {
	Replica string // the replica's ID
	// Sent is true when the request, or some of its body, may have reached
	// the replica: then it must not be sent again elsewhere.
	Sent bool
	// Down is true when the replica could not be reached at all (a dial
	// or TLS handshake failed, its host has no connection): it leaves
	// routing until a health check passes. A failure on one connection
	// (a kept-alive one the replica had closed) says nothing of the rest.
	Down bool
	Err  error // the cause
}

// Error implements error. Only a replica that could not be reached at all
// is called unreachable: one whose connection broke once the request was
// on it is up, as far as anyone knows.
func (e *UnreachableError) Error() string {
	switch {
	case e.Down:
		return fmt.Sprintf("replica %s unreachable: %v", e.Replica, e.Err)
	case e.Sent:
		return fmt.Sprintf("replica %s: the connection broke before it answered: %v", e.Replica, e.Err)
	default:
		return fmt.Sprintf("replica %s: the connection closed before the request was sent: %v", e.Replica, e.Err)
	}
}

// Retryable reports whether the request may go to another replica: nothing
// of it reached this one.
func (e *UnreachableError) Retryable() bool { return !e.Sent }

// TimeoutError is a replica that took the request and did not begin its
// answer in time (the transport's ResponseHeaderTimeout). The proxy answers
// 504.
type TimeoutError struct {
	Replica string // the replica's ID
	Err     error  // the cause
}

// Error implements error.
func (e *TimeoutError) Error() string {
	return fmt.Sprintf("replica %s timed out: %v", e.Replica, e.Err)
}

// InvalidResponseError is a replica whose answer was not valid HTTP/1.1 (a
// bad status line or header, a framing that cannot be trusted, such as two
// Content-Lengths), as the UpstreamClient reads it: the proxy answers 502,
// as RFC 9110 has a gateway do for an invalid response. (Another
// RoundTripper's such errors are *ReplicaError.)
type InvalidResponseError struct {
	Replica string // the replica's ID
	Err     error  // the cause
}

// Error implements error.
func (e *InvalidResponseError) Error() string {
	return fmt.Sprintf("replica %s sent an invalid response: %v", e.Replica, e.Err)
}

// HeaderTooLargeError is a request whose header block the replica host
// protocol cannot carry (a value over 64 KiB, say), though the proxy's
// own limit let it in: the proxy answers 431, and the replica saw nothing.
type HeaderTooLargeError struct {
	Replica string // the replica's ID
	Err     error  // the cause
}

// Error implements error.
func (e *HeaderTooLargeError) Error() string {
	return fmt.Sprintf("request to replica %s: %v", e.Replica, e.Err)
}

// ReplicaError is a replica that failed after taking the request: a
// body cut short after the response had begun (the
// proxy then aborts the client's connection, since the status is sent
// already). The proxy answers 500 when it still can.
type ReplicaError struct {
	Replica string // the replica's ID
	Err     error  // the cause
}

// Error implements error.
func (e *ReplicaError) Error() string {
	return fmt.Sprintf("replica %s failed: %v", e.Replica, e.Err)
}

// FullError is a replica that refused the request with a 503 marked by
// FullHeader: it was at its own limit and did not run the request. Nothing
// was written to the client. The proxy tries another replica when
// Retryable, and answers 503 with Retry-After (back pressure) when it
// cannot.
type FullError struct {
	Replica string // the replica's ID
	// BodyLost is true when some of the request's body was sent before the
	// refusal came and could not be kept for another try (it was longer
	// than UpstreamOptions.RetryBodyLimit).
	BodyLost bool
}

// Error implements error.
func (e *FullError) Error() string {
	if e.BodyLost {
		return fmt.Sprintf("replica %s is full (and the request body is spent)", e.Replica)
	}
	return fmt.Sprintf("replica %s is full", e.Replica)
}

// Retryable reports whether the request may go to another replica.
func (e *FullError) Retryable() bool { return !e.BodyLost }

// SessionError is a WebSocket session that ended because the replica's
// connection broke (a reset, a machine gone), not because either side
// closed it. The session had begun: it is recorded as 101, with this as
// its error.
type SessionError struct {
	Replica string // the replica's ID
	Err     error  // the cause
}

// Error implements error.
func (e *SessionError) Error() string {
	return fmt.Sprintf("WebSocket session with replica %s: the replica's connection broke: %v", e.Replica, e.Err)
}

// RequestBodyError is a client's request body that could not be read while
// it was being sent to the replica: the client left mid-upload, sent a
// malformed chunk, or went over the proxy's body limit (it unwraps to the
// *http.MaxBytesError then: 413).
type RequestBodyError struct {
	Err error // the cause
}

// Error implements error.
func (e *RequestBodyError) Error() string { return "reading the request body: " + e.Err.Error() }

// Unwrap returns the read's error.
func (e *RequestBodyError) Unwrap() error { return e.Err }

// Retryable reports whether err, from a Handle's Serve, allows the request
// to be sent to another replica: no replica accepted it (the connection was
// refused or broke before a byte was written, or the replica answered with
// a FullHeader 503), its body can be sent again, and nothing was written to
// the client. Any other error is final and mapped once.
func Retryable(err error) bool {
	var r interface{ Retryable() bool }
	return errors.As(err, &r) && r.Retryable()
}
