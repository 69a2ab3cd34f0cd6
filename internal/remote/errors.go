package remote

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/zeze-go/mq/internal/wire"
	"github.com/zeze-go/mq/store"
)

var (
	// ErrUnavailable is returned by Client.Call when the connection could
	// not be dialed or broke before the reply came: the peer closed it, or
	// a read or write failed or timed out. The request may have been
	// written before the break, so the call may have run on the peer: its
	// outcome is unknown, and the caller resolves it from durable state,
	// such as an Apply's dedup by message ID or a Decision, or retries only
	// what is idempotent.
	ErrUnavailable = errors.New("remote: peer unavailable")
	// ErrNotSent is wrapped, beside ErrUnavailable, when the request was
	// never written because the dial failed or the connection broke before
	// the request's turn: nothing ran on the peer, and the call may go to
	// another peer without doubt.
	ErrNotSent = errors.New("remote: request not sent")
	// ErrClosed is returned by Client.Call after Client.Close; calls
	// pending at Close fail with an error wrapping both ErrClosed and
	// ErrUnavailable.
	ErrClosed = errors.New("remote: client closed")
	// ErrUnknownOp is returned by Client.Call when the peer serves no
	// handler for the op.
	ErrUnknownOp = errors.New("remote: unknown op")
	// ErrProtocol is returned when a payload (a request on the server, a
	// reply on the client) does not decode.
	ErrProtocol = errors.New("remote: protocol error")
	// ErrRemote is what a handler's error without a registered sentinel
	// wraps on the client; its message is the handler's.
	ErrRemote = errors.New("remote: remote error")
)

// Error is a handler's error as a client receives it: errors.Is matches the
// sentinel its code names, or ErrRemote for an unknown code, and Error
// returns the handler's message.
type Error struct {
	Code    uint16
	Message string
	err     error // the sentinel of Code
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns the sentinel error of e.Code.
func (e *Error) Unwrap() error { return e.err }

// FirstUserCode is the first error code RegisterError accepts; the codes
// below are this package's.
const FirstUserCode = 1000

// The codes of this package. Values cross the wire: never renumber.
const (
	codeRemote        = 1 // no sentinel: ErrRemote
	codeUnknownOp     = 2
	codeProtocol      = 3
	codeFrameTooLarge = 4
	codeCanceled      = 10
	codeDeadline      = 11
	codeStoreClosed   = 20
	codeCorrupt       = 21
	codeFormat        = 22
	codeDecided       = 23
	codeStale         = 24
	codeBadCommand    = 25
	codeTooLarge      = 26
	codeFailed        = 27
	codeWALFailed     = 28
	codeClaimed       = 29
	codeOtherProducer = 30
	codeFrozen        = 31
	codePastEnd       = 32
)

type codedErr struct {
	code uint16
	err  error
}

// builtin is matched in this order: an error wrapping several sentinels,
// such as ErrTooLarge and wire.ErrFrameTooLarge, takes the first one's
// code.
var builtin = []codedErr{
	{codeUnknownOp, ErrUnknownOp},
	{codeProtocol, ErrProtocol},
	{codeStoreClosed, store.ErrClosed},
	{codeCorrupt, store.ErrCorrupt},
	{codeFormat, store.ErrFormat},
	{codeDecided, store.ErrDecided},
	{codeStale, store.ErrStaleGeneration},
	{codeClaimed, store.ErrClaimed},
	{codeOtherProducer, store.ErrOtherProducer},
	{codeFrozen, store.ErrFrozen},
	{codePastEnd, store.ErrPastEnd},
	{codeBadCommand, store.ErrBadCommand},
	{codeTooLarge, store.ErrTooLarge},
	{codeFailed, store.ErrFailed},
	{codeWALFailed, store.ErrWALFailed},
	{codeFrameTooLarge, wire.ErrFrameTooLarge},
	{codeCanceled, context.Canceled},
	{codeDeadline, context.DeadlineExceeded},
	{codeRemote, ErrRemote},
}

var registry struct {
	mu   sync.RWMutex
	user []codedErr // guarded by mu; sorted by code
}

// RegisterError maps code to err in both directions: a handler's error that
// errors.Is err crosses the wire as code, and a client receiving code
// returns an error that errors.Is err. Higher layers register their
// sentinels at init, with codes from FirstUserCode on; registered errors are
// matched before this package's, in code order. It panics on a code below
// FirstUserCode or one already registered, as these are programming errors.
func RegisterError(code uint16, err error) {
	if code < FirstUserCode || err == nil {
		panic(fmt.Sprintf("remote: RegisterError(%d, %v): codes below %d are reserved", code, err, FirstUserCode))
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	i, found := slices.BinarySearchFunc(registry.user, code, func(e codedErr, c uint16) int { return int(e.code) - int(c) })
	if found {
		panic(fmt.Sprintf("remote: RegisterError(%d): code taken by %v", code, registry.user[i].err))
	}
	registry.user = slices.Insert(registry.user, i, codedErr{code, err})
}

// codeOf returns the code of err's first matching sentinel, codeRemote if
// none matches.
func codeOf(err error) uint16 {
	registry.mu.RLock()
	for _, e := range registry.user {
		if errors.Is(err, e.err) {
			registry.mu.RUnlock()
			return e.code
		}
	}
	registry.mu.RUnlock()
	for _, e := range builtin {
		if errors.Is(err, e.err) {
			return e.code
		}
	}
	return codeRemote
}

// sentinelOf returns the sentinel of code, ErrRemote for an unknown one.
func sentinelOf(code uint16) error {
	if code >= FirstUserCode {
		registry.mu.RLock()
		defer registry.mu.RUnlock()
		if i, ok := slices.BinarySearchFunc(registry.user, code, func(e codedErr, c uint16) int { return int(e.code) - int(c) }); ok {
			return registry.user[i].err
		}
		return ErrRemote
	}
	for _, e := range builtin {
		if e.code == code {
			return e.err
		}
	}
	return ErrRemote
}

// Error payload (the payload of an opError frame):
//
//	version uint8 (errVersion)
//	code    uint16 big endian
//	message the rest: the handler's err.Error(), cut at maxErrMessage bytes
const (
	errVersion    = 1
	errFixed      = 1 + 2
	maxErrMessage = 4 << 10
)

// appendError appends the error payload of err.
func appendError(dst []byte, err error) []byte {
	msg := err.Error()
	if len(msg) > maxErrMessage {
		msg = msg[:maxErrMessage]
	}
	dst = append(dst, errVersion)
	dst = binary.BigEndian.AppendUint16(dst, codeOf(err))
	return append(dst, msg...)
}

// decodeError decodes an error payload into an *Error.
func decodeError(b []byte) (*Error, error) {
	if len(b) < errFixed {
		return nil, fmt.Errorf("%w: error payload of %d bytes", ErrProtocol, len(b))
	}
	if b[0] != errVersion {
		return nil, fmt.Errorf("%w: error payload version %d, want %d", ErrProtocol, b[0], errVersion)
	}
	code := binary.BigEndian.Uint16(b[1:])
	if len(b)-errFixed > maxErrMessage {
		return nil, fmt.Errorf("%w: error message of %d bytes", ErrProtocol, len(b)-errFixed)
	}
	return &Error{Code: code, Message: string(b[errFixed:]), err: sentinelOf(code)}, nil
}
