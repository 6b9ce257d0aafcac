package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/serveproxy/serveproxy/replica"
	"github.com/serveproxy/serveproxy/router"
)

// StatusClientClosedRequest is the status recorded (never sent: there is no
// one to send it to) when the client goes away before its answer, as nginx
// and Serve record it.
const StatusClientClosedRequest = 499

// statusOf maps an error of the request path to the status Serve answers
// with, in one place. It is the only function that decides statuses for
// errors.
func statusOf(err error) int {
	var (
		bp          *router.BackPressureError
		full        *replica.FullError
		unreachable *replica.UnreachableError
		invalid     *replica.InvalidResponseError
		timeout     *replica.TimeoutError
		tooLarge    *http.MaxBytesError
		badBody     *replica.RequestBodyError
		bigHeader   *replica.HeaderTooLargeError
	)
	switch {
	case errors.As(err, &bp), errors.Is(err, router.ErrNoReplicas), errors.As(err, &full):
		return http.StatusServiceUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusRequestTimeout
	case errors.Is(err, context.Canceled):
		return StatusClientClosedRequest
	case errors.As(err, &unreachable), errors.As(err, &invalid):
		return http.StatusBadGateway
	case errors.As(err, &timeout):
		return http.StatusGatewayTimeout
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.As(err, &badBody):
		return http.StatusBadRequest
	case errors.As(err, &bigHeader):
		return http.StatusRequestHeaderFieldsTooLarge
	}
	// A handler panic (*replica.PanicError), an aborted response, anything
	// else: the replica failed.
	return http.StatusInternalServerError
}

// writeError answers a request that failed before its replica wrote
// anything; a 503 says to retry after a second.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeErrorRetry(w, status, msg, status == http.StatusServiceUnavailable)
}

// writeErrorRetry is writeError, with a Retry-After of a second if retry.
func writeErrorRetry(w http.ResponseWriter, status int, msg string, retry bool) {
	if status == StatusClientClosedRequest {
		return // nobody is listening
	}
	if sw, ok := w.(*statusWriter); ok {
		sw.own = true // see closeIfBodyLeft
	}
	h := w.Header()
	if retry {
		h.Set("Retry-After", "1")
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg + "\n"))
}

// errorMessage is the body sent with an error status.
func errorMessage(status int, err error) string {
	switch status {
	case http.StatusServiceUnavailable:
		if errors.Is(err, router.ErrNoReplicas) {
			return "No replicas are available"
		}
		return "Service unavailable: " + err.Error()
	case http.StatusRequestTimeout:
		return "Request timed out"
	case http.StatusBadGateway:
		if _, ok := errors.AsType[*replica.InvalidResponseError](err); ok {
			return "Bad Gateway: the replica's answer was not valid HTTP"
		}
		if ue, ok := errors.AsType[*replica.UnreachableError](err); ok && ue.Sent && !ue.Down {
			// Reached, then lost: killed or restarted under the request.
			return "Bad Gateway: the connection to the replica broke before it answered"
		}
		return "Bad Gateway: the replica could not be reached"
	case http.StatusRequestHeaderFieldsTooLarge:
		return "Request Header Fields Too Large: more than the replica host protocol carries (64 KiB a header value or the path)"
	case http.StatusGatewayTimeout:
		return "Gateway Timeout: the replica did not answer in time"
	case http.StatusRequestEntityTooLarge:
		if tl, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return fmt.Sprintf("Request body too large: the limit is %d bytes (PROXY_MAX_BODY_BYTES)", tl.Limit)
		}
		return "Request body too large"
	case http.StatusBadRequest:
		return "Bad Request: " + err.Error()
	}
	return "Internal Server Error"
}
