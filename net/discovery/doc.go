// Package discovery finds lsync devices on the local network (issue 22):
// each daemon announces its device id and listen addresses in a signed
// datagram, and keeps a table of the devices it hears. It is the core
// only; the daemon decides what to dial (see "What the daemon must do").
//
// # Construction
//
// An Announcement carries the device id, its listen addresses, a timestamp
// in unix milliseconds, an optional "pairing open" flag and name, the
// device's Ed25519 public key and a signature by that key over a domain
// string and every other byte. The device id is derived from the key
// (messages.DeviceIDFromKey), so a listener checks the claim without any
// key exchange: no key but the device's own derives to its id, and only
// the device's own key makes the signature. The layout is fixed binary
// (announcement.go), at most MaxDatagram bytes, with a magic and a
// version byte, so the size and structure are checked before anything is
// allocated.
//
// A Service sends the announcement when it starts, every Interval (30 s),
// and at once when SetAddrs, SetName or SetPairingOpen change it; each
// timestamp is greater than the last. It goes to the IPv4 broadcast
// address of every interface that is up (the loopback's included, which
// reaches the host's own daemons on Linux) and to the IPv6 link-local
// group DefaultGroup6 on every multicast interface, on DefaultPort
// (21029; Syncthing's is 21027). Every daemon of a host listens on that
// port (SO_REUSEPORT) and gets its own copy of each datagram, so several
// daemons of one machine find each other. Config.Targets replaces the
// destinations (the tests send to 127.255.255.255 only).
//
// A Table takes each datagram through the checks cheapest first and
// classifies it as one Result, the label of
// lsync_discovery_announcements_total: size, magic and version, structure
// (Malformed); this device's own announcement (Ignored); the token bucket
// of the source IP (RateLimited); the id's derivation from the key
// (BadSignature); the timestamp's age, at most Policy.MaxAge old and
// Policy.MaxFuture ahead, and replay, newer than the last accepted from
// the device (Stale; a byte-identical copy of that last one, which every
// dual-stack LAN delivers, is Ignored); the table-wide budget of signature
// checks (RateLimited); and only then the signature (BadSignature, or
// Accepted). The table keeps the last accepted announcement of each
// device with when and where from it was heard, tells its owner through
// Changes when a device appears, changes or leaves, and expires entries
// not heard from for Policy.ExpireAfter (three intervals).
//
// # Threat model
//
// Anyone on the LAN can send anything to the port, from any source address
// (UDP sources are not authenticated), and can hear every announcement.
//
// Forged announcements fail the key derivation or the signature: nobody
// without a device's key can make it announce other addresses, name or
// flag. The datagram's source address is not signed: a copy of a genuine
// announcement can arrive from elsewhere, so Entry.Source, and the
// addresses DialAddrs derives from it for an unspecified host, are hints.
//
// Replayed announcements are not newer than the last one accepted from
// their device and are dropped. The table forgets a device it evicts or
// expires; a replay then passes only while it is younger than MaxAge, and
// shows addresses the device announced at most that long ago.
//
// Floods are bounded in memory and CPU. Memory: a datagram is refused by
// its size before it is parsed; the table holds at most MaxUnpaired
// unpaired devices (the least recently seen is evicted; a flood of valid
// announcements from throwaway keys evicts genuine unpaired devices, never
// paired ones); the source buckets are capped (MaxSources; a bucket that
// has refilled is dropped, and past the cap new sources share one
// bucket). CPU: every check before the signature costs well under a
// microsecond (BenchmarkReceive), and signature checks are capped by a
// table-wide budget (VerifyRate: 200 a second by default, 1-2% of a core), whatever
// the number of spoofed sources. A flood can therefore deny discovery (by
// spending the budget on forgeries with fresh timestamps, or the bucket
// shared by a host's daemons), but cannot hijack an address, grow memory,
// or take more than its budget of CPU. Discovery is a convenience on top
// of typed addresses and the library's address book, which a LAN flood
// does not touch.
//
// An eavesdropper on the LAN learns every announcing device's id, public
// key, name and listen addresses, when it has a pairing code pending, and
// can recognise the same device on another network by its id. Nothing
// announced lets it pair: the pairing flag carries nothing derived from
// the code (a code is about 32 bits; any beacon of it would be brute-forced
// offline), and pairing is a PAKE. Turn discovery off (--discovery=false)
// where that exposure matters.
//
// A device whose clock is more than MaxAge behind or MaxFuture ahead of a
// listener's is not heard by it (Stale).
//
// # What the daemon must do
//
//   - Start a Service with the device key, its listen addresses (concrete
//     ones where it can: an unspecified host is dialed at the datagram's
//     unauthenticated source address), its name; OnResult counts
//     lsync_discovery_announcements_total{result} (register Results() up
//     front); OnChange forwards each Change to the actor that owns the
//     address book, without blocking. Close it at shutdown.
//   - Call SetPaired with the paired devices at start and whenever the peer
//     store changes, so a flood never evicts them; SetAddrs when its listen
//     addresses change; SetPairingOpen(true) while a pairing code is
//     pending and false once it is used or expired.
//   - For a paired device, treat an Appeared or Updated change as
//     addresses to try: dial DialAddrs with the device's pinned key and
//     record an address in the address book (learnt "local") only after a
//     QUIC handshake with that pinned key succeeds on it. Never replace a
//     paired device's known-good address on the strength of an
//     announcement alone: the announcement proves the device said it, not
//     that the address reaches it (the source and a stale-but-young
//     replay are an attacker's to choose).
//   - Never dial an unpaired device but to pair: list it (Devices: name,
//     id, addresses, seen ago) for `network nearby` and the status page.
//     `pair join CODE` without --addr runs the PAKE with the devices whose
//     PairingOpen is set, most recently seen first, until one succeeds,
//     and tries a handful at most: anyone can set the flag (on throwaway
//     keys too), each PAKE run with a device that is not the generator is
//     one online guess of the code for it and a failed attempt against
//     that device's own code. The PAKE's result, not the flag, says which
//     device generated the code.
package discovery
