// Package memnet is an in-memory implementation of net.Transport with
// deterministic fault injection. The multi-device simulation tests run the
// actor runtime on it; the runtime cannot tell it from the QUIC transport.
//
// A Network holds the devices. Each device calls Listen to get a Transport
// at the synthetic address "mem:<device id>"; Dial reaches a listener only if
// the two devices were paired with Pair, and is refused with
// net.ErrNotPaired or net.ErrWrongPeer otherwise, like a pinned-certificate
// handshake.
//
// # Guarantees
//
// Every frame crosses the real codec: messages.EncodeFrame on send; on
// receive, the envelope is parsed, the transport's net.Authorizer (if
// SetAuthorizer set one) is asked about it, and only then is the message
// decoded. The receiver gets its own decoded copy, never a pointer the
// sender holds; a message the codec cannot encode fails Send, Request or
// Reply; one that fails validation is refused by the receiver and counted
// (Stats.Rejected, Observer.Rejected), and a refused request is answered
// with a bad_request *messages.Error. A frame the Authorizer refuses is
// counted the same way (under net.RefusalReason), a live one dropped and
// a request answered with unauthorized.
//
// Live messages of one library on one connection arrive in send order,
// unless a reorder fault holds one back. Each connection direction admits
// at most the queue size (default 1024) of live messages, and at most the
// queue bytes (default 32 MiB) of live and request frames, that are sent
// and not yet received; Send and Request block beyond that until ctx ends
// or the connection does (a frame larger than the queue bytes waits until
// it is alone). Frames wait undecoded: Recv decodes one at a time. So what
// a connection holds is bounded as with QUIC, and a peer that floods
// blocks itself. The transport starts no goroutine of its own: delivery
// runs on the sender's goroutine, and delayed frames on one time.AfterFunc
// timer per Network.
//
// # Faults
//
// Each directed link (from device, to device) has its own PRNG, seeded from
// the network seed and the two device ids, and kept across reconnections.
// Every live message and every request draws exactly one decision from it,
// in that link's send order, and a decision always consumes the same number
// of draws whatever the configuration: the same seed and the same sends
// give the same drops, duplicates, reorders, delays and failed requests.
// Faults are set network-wide (SetFaults) or per directed link
// (SetLinkFaults), and removed with ClearFaults.
//
// A reordered message is held back by reorderHold (virtual time in stepped
// mode) and does not hold back its successors, so it arrives after every
// message of its stream sent within that window. A failed request is still
// delivered and answered; its response is lost and Request returns
// ErrStreamReset, so the handler's side effects happen without the
// requester knowing.
//
// Partition closes every connection between two devices (Err wraps
// ErrPartitioned and net.ErrClosed) and refuses Dial between them until
// Heal or HealAll.
//
// # Stepped mode
//
// A Network made by NewSteppedNetwork never delivers on its own: frames
// queue, ordered by (due time, send order) where due times run on a virtual
// clock, and the test delivers them with Step or Flush. Flush and Step also
// work in real-time mode, delivering early.
//
// Hazard: in stepped mode a Request blocks until someone steps both the
// request and its response, so call it from another goroutine than the one
// that steps. Send and Request also block, in either mode, once the queue
// bounds are reached, until the peer's Recv takes frames out.
//
// Hazard: fault decisions are deterministic; the interleaving of goroutines
// is not. A simulation replays exactly only if each device sends on a link
// from one goroutine (an actor) and the test drives delivery in stepped mode.
//
// Hazard: frames still in flight or unread when a connection closes are
// lost, as with a QUIC connection close; they count in no statistic.
package memnet
