// Package net is lsync's network layer: the device identity, the trust
// store of pinned peers, the QUIC transport behind the Transport seam, and
// pairing. (net/memnet is the in-memory twin the simulations run on.)
//
// # Identity and trust
//
// A device is an Ed25519 key kept in its home (device.key, mode 0600) and a
// self-signed certificate for it (device.crt). The home must be a
// directory of this user that group and others cannot write (SecureHome
// refuses any other, saying how to fix it), and its files are opened
// without following links (OpenInHome) and rewritten by rename, so a link
// planted in it is neither read through nor written through. Its DeviceID is derived from
// the public key — the first 16 bytes of SHA-256(key) with the UUID version
// 8 and RFC 4122 variant bits — so no certificate can claim another
// device's id. The PeerStore (peers.json, rewritten atomically) pins each
// paired device's certificate fingerprint (SHA-256 of the DER) under that
// id. On lsync/1 both sides require a certificate (TLS 1.3, mutual) and
// admit it only if it is pinned under the id derived from its key and, when
// dialing, that id is the one dialed. An unpaired device fails the TLS
// handshake; the refusal is counted as "unpaired" or "wrong_peer", a
// client without a certificate and a handshake for another protocol
// (ALPN) are counted too (see observer.go for their reasons).
//
// # Transport
//
// One quic.Transport on one UDP socket listens and dials, so each peer is
// client and server at once and the source address of an inbound
// connection is also where to dial that peer back. Every stream starts with
// one kind byte written by its opener:
//
//	'C' control  bidirectional, the dialer's first stream: Hello each way,
//	             then Ping/Pong (RTT, keep-alive) and Error
//	'L' live     unidirectional, one per library and direction, opened on the
//	             first Send: that library's frames, in order
//	'R' request  bidirectional, one per Conn.Request: one request frame, then
//	             one response frame
//	'P' pairing  bidirectional, on lsync-pair/1 connections only
//
// A Conn is returned only after both Hellos: the dialer writes first, the
// acceptor writes its own before reading, and each checks the other's
// schema version itself. The side that sees a mismatch counts it, sends
// messages.Error{schema_mismatch} phrased for the peer, and closes the
// connection with the same text as the reason; Dial returns a
// *messages.VersionError (or, if the peer's close came first, an error
// wrapping messages.ErrSchemaVersion with its text), which says which side
// must upgrade.
//
// Frames are DESIGN §7 frames (messages.EncodeFrame layout, zstd above the
// codec's threshold), read with messages.FrameReader: their length is
// checked against Config.MaxFrame before anything is allocated, and a
// large body's buffer grows with the bytes that arrive, so announced
// lengths cannot reserve memory that QUIC flow control never let the peer
// send.
//
// # Guarantees
//
// Live messages of one library arrive in the order they were sent, or the
// connection fails: a live stream that breaks while the connection lives
// (the peer refused it) closes the connection rather than skip frames.
//
// Bulk never blocks live: each request runs on its own stream, each
// library's live frames on theirs, and QUIC flow control is per stream.
//
// Back-pressure, sending: Send blocks while Config.SendQueue frames of the
// connection are queued and unwritten, and writers block on QUIC flow
// control while the peer does not read.
//
// Back-pressure, receiving: every path from a stream to Recv is bounded
// per connection, so a peer sending faster than the consumer calls Recv
// stalls its own streams instead of growing the receiver's memory.
//
//   - Each stream has one reader, which holds at most one frame: it reads
//     the frame (its length checked first, its buffer growing with the
//     bytes that arrive), checks and authorizes its envelope, and then
//     takes the message's payload size (Inbound.PayloadBytes) from the
//     connection's receive budget (Config.RecvBuffer) before it decodes
//     it. Recv gives the share back when it returns the message; the inbox
//     also holds at most 64 messages.
//   - At most maxPendingRequests (16) request streams are accepted and not
//     yet returned by Recv; further ones wait inside QUIC, bounded by
//     MaxIncomingStreams and the flow-control windows.
//
// A reader that waits stops reading its stream; QUIC then stops granting
// the peer credit, the peer's writers block, and its Send blocks. What one
// connection holds is thus RecvBuffer of decoded messages (plus their
// in-memory overhead), one frame per stream whose reader waits (live
// streams of libraries the Authorizer admits, and pending requests), and
// QUIC's receive window (quic-go's default: at most 15 MiB). Other
// connections are not affected: each has its own.
//
// Budget is taken only once a frame has fully arrived, and is freed only
// by Recv. A reader holding budget while waiting for the rest of its frame
// could wait for ever: the streams left unread for want of that budget
// keep their bytes in QUIC's connection window, which then lets no more
// bytes in, for any stream.
//
// Hazard: the same holds for this side's own requests. While the consumer
// does not call Recv, the peer's unread live bytes fill the connection
// window and the responses to our requests on that connection stall too.
// A consumer must not make its next Recv wait for a response from the
// same peer.
//
// Hazard: the receive budget counts msgpack bytes; a decoded message can
// take up to 8 times that in memory (interfaces, slice headers: the
// decode budget messages enforces), though lsync's own messages take 2-6.
// Consumers that queue messages should budget by PayloadBytes too, and
// stop calling Recv when their own bound is reached: that is what turns
// a slow consumer into a stalled sender.
//
// Authorization: Config.Authorize (or SetAuthorizer) is asked about every
// live message and request with the sender, library and type from the
// envelope, after the frame is read and before its payload is
// decompressed or decoded: a zstd bomb for a library the peer is not a
// partner of costs its wire bytes. A refused request is answered with
// messages.Error{unauthorized}; a refused live message is counted, logged
// and dropped, and its stream goes on: refusing the stream would make the
// sender close the connection (live order), cutting the peer's other
// libraries off because of one it may not be a partner of any more.
//
// Bad input on a stream — garbage, an oversized length, a malformed or
// unknown message, a Hello after the handshake, an unknown stream kind —
// is counted with Observer.Rejected, logged, and closes that stream only
// (CancelRead/CancelWrite with code 0x10); a request that parses but does
// not decode is answered with bad_request. The connection and its other
// streams go on. Nothing from the wire can panic the process. Frames on
// the control stream (Hello included) are at most 64 KiB and never
// compressed: a compressed one is refused undecoded.
//
// Every refusal is counted, but logged at a bounded rate: one line per
// (peer or source address, reason) per 30 s, the next line saying how many
// were suppressed meanwhile.
//
// Close closes every connection with a CONNECTION_CLOSE, ends pending
// pairing codes, and returns after every goroutine of the transport did.
//
// Hazard: Inbound.Reply must be called (once) for every request, or the
// stream stays open until the connection ends. Reply blocks until the
// response is handed to QUIC, which for a large response follows the
// requester's reading.
//
// # Bandwidth
//
// Each direction has a limit over the whole transport and one per peer
// (bytes per second, 0 for none), each a token bucket; a chunk passes the
// peer's bucket, then the transport's, so the lower of the two sets the
// pace of a connection and the connections together stay under the
// transport's. SetLimits changes them at once: it wakes every writer and
// reader asleep on a debt, which pays what is left of it at the new rate
// (nothing, for no limit); it writes them to bandwidth.json in
// Config.Home first, and Listen reads them back. The global upload limit
// set there wins over Config.BandwidthLimit, which applies until one is
// set, and again once it is cleared.
//
// Uploads are paid per 16 KiB chunk before it is written (a frame larger
// than that pays as it goes). Downloads are paced by reading: under a
// limit a read takes at most 16 KiB and pays for it before the next read,
// so the stream's unread bytes stay in QUIC, whose flow control stops the
// peer: the sender slows to the limit without knowing it. What arrives at
// the socket can run ahead of what is read by QUIC's receive windows (at
// the start of a limit, or with many streams at once); the rate read —
// Bandwidth's, and lsync_bytes_total's — keeps to the limit, give or take
// a chunk per stream.
//
// Exempt: the control stream (Hello, Ping, Pong) in both directions, and
// pairing, so a limit does not delay the handshake nor inflate the
// Ping/Pong RTT with the queue of a bulk transfer; QUIC's own keep-alives
// (PING frames) are not flow controlled, so a limited link never idles
// out. Every frame is metered, control frames included (Bandwidth.Rates,
// averaged over the last RateWindow).
//
// Hazard: QUIC's connection window is shared by every stream, the control
// stream too. Under a download limit with several streams at once (a join
// runs requests ahead) the unread bytes can fill it, and the peer's next
// Ping then waits for the window update this side sends once it has read
// a quarter of the window (quic-go: 192 KiB of the initial 768 KiB). With
// four 900 KiB responses read at 200 kB/s, the RTT read 20 to 160 ms
// instead of under a millisecond (one stream alone leaves the window room:
// no change). Lower limits stretch that in proportion; the link is slow,
// not dead.
//
// Hazard: a limit low enough that one bulk response (a join's page) takes
// longer than the requester's timeout to cross makes that request fail and
// retry: slow links want small pages too (lsync serve --page-size).
//
// # Pairing
//
// Pairing runs on the same socket with ALPN lsync-pair/1, where any device
// certificate is accepted: CPace (draft-irtf-cfrg-cpace) over ristretto255
// authenticates. The creator shows a code like WXYZ-1234 (four letters of
// an alphabet without I, L, O; four digits; about 31 bits from
// crypto/rand), valid for a TTL and a few wrong attempts. The joiner opens
// a 'P' stream and the exchange is:
//
//	J→C  Ya = ya·G(code)
//	C→J  Yb_i = yb_i·G(code_i), one per pending (or recently expired) code
//	J→C  MAC_J(ISK_i) for each i
//	C→J  reject(failed | expired), or MAC_C(ISK) + creator info sealed
//	J→C  joiner info, sealed
//	C→J  done (the creator has pinned the joiner); the joiner pins the creator
//
// with G(code) = HashToElement(code ‖ sid ‖ both certificate fingerprints
// in sorted order ‖ both device ids in the same order), sid a TLS exporter
// value of this session, K = y·Y_other, ISK = SHA-512(DST ‖ sid ‖ K ‖ Ya ‖ Yb),
// MACs HMAC-SHA-256 keyed by ISK, and the infos (name, listen address)
// sealed with AES-GCM under keys derived from ISK.
//
// Hazard: offline guessing. A wrong-code joiner sees only Yb_i = yb_i·G_i
// with fresh random yb_i: for every candidate code there is a scalar giving
// that same element, so the Yb_i are independent of the codes and no guess
// can be checked against them. The creator checks the joiner's MACs before
// it sends anything derived from ISK, and on failure answers a bare
// "reject": the attempt learns one bit for its one guess, online.
//
// Online guessing against denial of service. Attempts are counted per
// source — the joiner's IP address, or its IPv6 /64 (a certificate costs
// nothing to make, an address does) — and per code:
//
//   - a wrong attempt costs its source one attempt on every pending code
//     it was tried against (the creator cannot tell which code the joiner
//     meant); a source with no attempts left on a code is not answered for
//     it, and one with none left on any code is told so (ErrPairingLocked)
//     without a PAKE, so the user knows to generate a new code;
//   - a code ends (ErrPairingExhausted) after attempts × 8 wrong attempts
//     in all (24 by default), which takes at least 8 sources;
//   - an attempt is counted when the joiner's confirmation is tested,
//     under one lock with the check that its source has one left, so
//     however many exchanges a source runs at once it tests no more
//     guesses than its attempts (the others are told it is locked out);
//     an exchange that never confirms, or whose slot is cut, tested no
//     guess and costs nothing.
//
// So an online attacker gets at most 24 guesses per code out of ~2.8·10⁹
// however many addresses it has, and with fewer than 8 addresses it can
// neither end a code the user is about to type nor lock the user out: its
// guesses only lock its own addresses. The price: a joiner sharing an
// address with the attacker (same NAT) shares its attempts, and a
// botnet can end codes; the user then generates another.
//
// Hazard: slots. At most 64 pairing exchanges run at once, and each
// message of the joiner must arrive within 2 s (the first one counted from
// the start of the exchange), so connections that send nothing give their
// slot back within seconds. Until its confirmation verifies, an exchange
// cannot tell an honest joiner from a flooder (anything a joiner could
// send earlier that the creator can check, a fake creator could check
// offline), so the slots are shared, not rationed (pairslots.go): a
// connection that finds them all held takes the slot of an exchange not
// yet proven, of the source holding the most (its own source's on a tie),
// the least advanced one first, then the oldest; the exchange cut is told
// "busy" (ErrPairingBusy, tried again by JoinPairing) and counted as
// pairing_preempted, and it tested no guess. So a flood from fewer than
// 64 addresses, however fast, can neither refuse nor cut the exchange of
// a joiner from another address. From the joiner's own address (same
// host, NAT or IPv6 /64), the flood's newest connections cut that
// address's oldest, those that said nothing first: a join from there is
// cut only if the flood opens some 64 connections before the creator has
// read the join's share (if the flood's connections say nothing), or
// before the join's confirmation arrives a round trip later (if they send
// a share and stall). Admission follows the QUIC handshake, which proves
// the source address: a spoofed one can neither take nor cut slots. A
// connection is refused outright (pairing_busy) only if every exchange is
// proven, which takes 64 right codes at once.
//
// Hazard: the joiner confirms first, so whoever answers at the address the
// joiner typed (a fake creator) receives MAC_J for each Yb it sent: it may
// test one guessed code per Yb it sent, online, per attempt of the user.
// The joiner accepts at most 16 shares, so that is at most 16 guesses out
// of ~2.8·10⁹ per attempt, and a failed pairing is visible to the user.
//
// Hazard: man in the middle. A relay terminates two TLS sessions, so the
// two ends compute G from different session ids and different certificate
// fingerprints: their keys differ, the MACs fail, and the attempt counts as
// a wrong code. Without the code the relay cannot run two honest CPace
// sessions instead; with it, it is a participant, which no PAKE prevents.
// Once the MACs verified, both ends know that the certificate each of them
// saw is the other's, and pin exactly that.
//
// Hazard: which code? The joiner does not say which code it uses (sending
// any function of it would allow offline guessing), so the creator answers
// with a share for every pending code — and, when none is pending, for a
// random generator, so an attempt looks the same either way. A code that
// expired within the last hour stays a candidate only to tell a joiner
// holding it "pairing code expired"; a used or disabled code is forgotten
// and looks wrong.
//
// Hazard: small-subgroup and identity shares. Ristretto255 has prime order
// and no small subgroup; shares that do not decode or decode to the
// identity, and a K equal to the identity, abort the exchange.
package net
