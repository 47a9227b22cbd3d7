package main

// Arguments and results of the control-socket operations. The results are
// also what --json prints, so their keys follow DESIGN.md §8.

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/net"
)

// Operation names.
const (
	opDeviceShow    = "device.show"
	opLibraryCreate = "library.create"
	opLibraryList   = "library.list"
	opLibraryOpen   = "library.open"
	opLibraryClose  = "library.close"
	opPairGenerate  = "pair.generate"
	opPairJoin      = "pair.join"
	opPeers         = "network.peers"
	opDiscover      = "network.discover"
	opSyncSetup     = "network.sync_setup"
	opLocationAdd   = "location.add"
	opLocationScan  = "location.rescan"
	opLocationList  = "location.list"
	opLocationRm    = "location.remove"
	opLocationSet   = "location.set"
	opMembers       = "library.members"
	opTagCreate     = "tag.create"
	opTagApply      = "tag.apply"
	opAlbumCreate   = "album.create"
	opAlbumAdd      = "album.add"
	opAlbumRemove   = "album.remove"
	opMetaSet       = "meta.set"
	opQuery         = "query"
	opSyncStatus    = "sync.status"
	opSyncFailed    = "sync.failed"
	opSyncRetry     = "sync.retry"
	opSyncVerify    = "sync.verify"
	opSyncFilter    = "sync.filter"
	opLibraryRepair = "library.repair"
	opSyncRemove    = "network.sync_remove"
	opWatch         = "watch"
	opLibraryRename = "library.rename"
	opLibraryDelete = "library.delete"
	opTagList       = "tag.list"
	opTagRename     = "tag.rename"
	opTagDelete     = "tag.delete"
	opTagRemove     = "tag.remove"
	opAlbumList     = "album.list"
	opAlbumRename   = "album.rename"
	opAlbumDelete   = "album.delete"
	opMetaUnset     = "meta.unset"
	opLog           = "log"
)

type deviceInfo struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	Listen        string `json:"listen"`
	Metrics       string `json:"metrics,omitempty"`
	UI            string `json:"ui,omitempty"` // the status page's URL
	Home          string `json:"home"`
	PID           int    `json:"pid"`
	SchemaVersion int    `json:"schema_version"`
	// Bandwidth is the limits in force and the rates measured (sync limit).
	Bandwidth *net.Bandwidth `json:"bandwidth,omitempty"`
}

type syncRemoveArgs struct {
	Lib    string `json:"lib"`
	Device string `json:"device"`
}

func (a libArgs) libName() string         { return a.Lib }
func (a locationAddArgs) libName() string { return a.Lib }
func (a locationArgs) libName() string    { return a.Lib }
func (a tagCreateArgs) libName() string   { return a.Lib }
func (a tagApplyArgs) libName() string    { return a.Lib }
func (a albumCreateArgs) libName() string { return a.Lib }
func (a albumEntryArgs) libName() string  { return a.Lib }
func (a queryArgs) libName() string       { return a.Lib }
func (a syncRemoveArgs) libName() string  { return a.Lib }
func (a renameArgs) libName() string      { return a.Lib }
func (a rowArgs) libName() string         { return a.Lib }
func (a logArgs) libName() string         { return a.Lib }

type libArgs struct {
	Lib string `json:"lib"`
}

type nameArgs struct {
	Name string `json:"name"`
}

type libraryInfo struct {
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	Open  bool   `json:"open"`
	Error string `json:"error,omitempty"` // why it failed to open
}

type pairGenerateArgs struct {
	Wait bool          `json:"wait"`
	TTL  time.Duration `json:"ttl"`
}

// maxPairTTL is the longest a pairing code may stay valid: a code is a
// short secret, guessable given time.
const maxPairTTL = 24 * time.Hour

// checkPairTTL refuses a pairing code TTL that is not positive or longer
// than maxPairTTL.
func checkPairTTL(ttl time.Duration) error {
	if ttl < time.Second || ttl > maxPairTTL {
		return fmt.Errorf("--ttl %s: want 1s to 24h", ttl)
	}
	return nil
}

type pairCode struct {
	Code    string    `json:"code"`
	Expires time.Time `json:"expires"`
	Listen  string    `json:"listen"` // where the joiner dials this device
	Paired  *peerInfo `json:"paired,omitempty"`
}

type pairJoinArgs struct {
	Code string `json:"code"`
	Addr string `json:"addr"`
}

type peerInfo struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Addr is where the device was last reached (the best of Addrs),
	// AddrLearnt how that address was learnt (typed, member, local, peer)
	// and AddrLastOK when a handshake last succeeded there.
	Addr       string      `json:"addr,omitempty"`
	AddrLearnt string      `json:"addr_learnt,omitempty"`
	AddrLastOK time.Time   `json:"addr_last_ok,omitzero"`
	Addrs      []knownAddr `json:"addrs,omitempty"` // the address book, in the order dials try it
	Connected  bool        `json:"connected"`
	RTTMillis  float64     `json:"rtt_ms"`
	PairedAt   time.Time   `json:"paired_at,omitzero"`
	LastError  string      `json:"last_error,omitempty"` // why it is not connected, if known
	// PausedSince: syncing with it is paused here in every library (sync
	// pause --device) since then; PausedIn: the libraries paused with it
	// (the device there, or the library with everyone).
	PausedSince time.Time       `json:"paused_since,omitzero"`
	PausedIn    []pausedLibrary `json:"paused_in,omitempty"`
}

type deviceArgs struct {
	Device string `json:"device"`
	// ConnectTimeout bounds the wait for the device to connect (0: 15 s).
	ConnectTimeout time.Duration `json:"connect_timeout,omitempty"`
}

type syncSetupArgs struct {
	Device         string        `json:"device"`
	Library        string        `json:"library"`
	Action         string        `json:"action"`
	Snapshot       bool          `json:"snapshot,omitempty"`      // join by copying the database file
	Backfill       bool          `json:"backfill,omitempty"`      // join row by row, whatever the size
	SnapshotOver   uint64        `json:"snapshot_over,omitempty"` // rows over which a join takes a snapshot (0: the default)
	ConnectTimeout time.Duration `json:"connect_timeout,omitempty"`
	// Models, ExcludeModels: what this device takes of the library (a
	// filter set before the join; selective sync).
	Models        []string `json:"models,omitempty"`
	ExcludeModels []string `json:"exclude_models,omitempty"`
}

type syncSetupResult struct {
	Library      string `json:"library"`
	Name         string `json:"name"`
	RemoteDevice string `json:"remote_device"`
	RemoteName   string `json:"remote_name,omitempty"`
	Action       string `json:"action"`
	Phase        string `json:"phase"`
	// Join: the path a join took, and why.
	Join *actors.JoinChoice `json:"join,omitempty"`
}

// joinProgress is streamed while a join backfills.
type joinProgress struct {
	Phase         string  `json:"phase"`
	Pages         int     `json:"pages"`
	Records       int64   `json:"records"`
	Expected      int64   `json:"expected_records"`
	Bytes         int64   `json:"bytes"`
	RecordsPerSec float64 `json:"records_per_sec"` // recent rate; the average once Done
	ETASeconds    float64 `json:"eta_seconds"`     // 0: none yet
	Jobs          int     `json:"jobs"`
	LastError     string  `json:"last_error,omitempty"`
	// Done marks the last frame: the finished join's totals.
	Done           bool    `json:"done,omitempty"`
	ElapsedSeconds float64 `json:"elapsed_seconds,omitempty"`
	// Snapshot: a join by snapshot's download (phase copying_snapshot
	// while it runs; the copy's totals in the frames after it).
	Snapshot *actors.SnapshotDownload `json:"snapshot,omitempty"`
}

// phaseCopyingSnapshot is the phase of a join by snapshot's frames while
// the copy downloads (the library does not exist here yet).
const phaseCopyingSnapshot = "copying_snapshot"

type locationAddArgs struct {
	Lib        string `json:"lib"`
	Path       string `json:"path"`
	Name       string `json:"name"`
	Index      bool   `json:"index"`
	SkipHidden bool   `json:"skip_hidden"`
	NoWatch    bool   `json:"no_watch,omitempty"`
	Progress   bool   `json:"progress"` // the client shows progress: count first, for a total
}

// locationArgs name a location of a library: by uuid, exact name, or (Path,
// absolute, when the argument looked like a path) its folder or a folder
// inside it.
type locationArgs struct {
	Lib        string `json:"lib"`
	Location   string `json:"location"`
	Path       string `json:"path,omitempty"`
	SkipHidden bool   `json:"skip_hidden,omitempty"`
	Progress   bool   `json:"progress,omitempty"`
}

// rescanResult is what `location rescan` prints.
type rescanResult struct {
	Location string `json:"location"`
	Name     string `json:"name"`
	Path     string `json:"path"`
	Subtree  string `json:"subtree,omitempty"`
	actors.RescanResult
	Seconds float64 `json:"seconds"`
}

// locationInfo is one line of `location list`.
type locationInfo struct {
	UUID       string `json:"uuid"`
	Name       string `json:"name"`
	Path       string `json:"path"`
	Device     string `json:"device"`
	DeviceName string `json:"device_name,omitempty"`
	Own        bool   `json:"own"` // a location of this device
	Entries    int    `json:"entries"`
	Incomplete bool   `json:"incomplete"`               // an index or rescan started and has not finished
	Scan       string `json:"scan,omitempty"`           // its kind: index or rescan
	Running    bool   `json:"scanning,omitempty"`       // it is running now
	Watched    bool   `json:"watched,omitempty"`        // this device follows its folder (own locations)
	Missing    bool   `json:"folder_missing,omitempty"` // its folder is not there (own locations): entries kept
	LastError  string `json:"last_error,omitempty"`     // why its last index or rescan failed, until one succeeds
	SkipHidden bool   `json:"skip_hidden,omitempty"`
	// Ignore is what its .lsyncignore holds (own locations that have one).
	Ignore *actors.IgnoreInfo `json:"ignore,omitempty"`
}

// locationSetArgs change this device's settings of one of its locations.
type locationSetArgs struct {
	locationArgs
	Watch      *bool `json:"watch,omitempty"`
	SkipHidden *bool `json:"skip_hidden_set,omitempty"`
}

// locationSettings is what `location set` prints.
type locationSettings struct {
	UUID       string `json:"uuid"`
	Name       string `json:"name"`
	Path       string `json:"path"`
	Watch      bool   `json:"watch"`
	SkipHidden bool   `json:"skip_hidden"`
}

type locationRemoved struct {
	UUID    string `json:"uuid"`
	Name    string `json:"name"`
	Path    string `json:"path"`
	Entries int    `json:"entries"` // entries removed with it
}

// indexProgress is streamed while a location is indexed.
type indexProgress struct {
	Verb    string `json:"verb,omitempty"` // "" (indexing) or rescanning
	Phase   string `json:"phase"`          // counting, indexing
	Total   int    `json:"total"`          // entries found by the counting pass
	Entries int    `json:"entries"`
	Files   int    `json:"files"`
	Dirs    int    `json:"dirs"`
	Bytes   int64  `json:"bytes"`
	// The daemon's rate of entries over the last seconds, and the ETA at
	// it: 0 until there is a second of progress.
	PerSec     float64 `json:"entries_per_sec,omitempty"`
	ETASeconds float64 `json:"eta_seconds,omitempty"`
}

// indexSummary is an index run's totals (the JSON of actors.IndexProgress)
// and how long it took.
type indexSummary struct {
	actors.IndexProgress
	Seconds float64 `json:"seconds"`
}

type locationResult struct {
	UUID    string        `json:"uuid"`
	Library string        `json:"library"`
	Path    string        `json:"path"`
	Name    string        `json:"name"`
	Watched bool          `json:"watched"`
	Indexed *indexSummary `json:"indexed,omitempty"`
}

type tagCreateArgs struct {
	Lib       string `json:"lib"`
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	Color     string `json:"color,omitempty"`
}

type tagResult struct {
	UUID      string `json:"uuid"`
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}

type tagApplyArgs struct {
	Lib   string `json:"lib"`
	Tag   string `json:"tag"`
	Entry string `json:"entry"`
}

type tagApplyResult struct {
	Tag       string `json:"tag"`
	Entry     string `json:"entry"`
	TagName   string `json:"tag_name,omitempty"`
	EntryPath string `json:"entry_path,omitempty"` // where the entry is, on its device
}

type albumCreateArgs struct {
	Lib         string `json:"lib"`
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
}

type albumResult struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
}

type albumEntryArgs struct {
	Lib   string `json:"lib"`
	Album string `json:"album"`
	Entry string `json:"entry"`
}

type albumEntryResult struct {
	Album string `json:"album"`
	Entry string `json:"entry"`
}

// metaFields are the user metadata fields `meta set` knows; nil: unchanged.
type metaFields struct {
	Favorite *bool   `json:"favorite,omitempty"`
	Hidden   *bool   `json:"hidden,omitempty"`
	Note     *string `json:"note,omitempty"`
	Rating   *int64  `json:"rating,omitempty"`
}

func (f metaFields) toMap() map[string]any {
	m := map[string]any{}
	if f.Favorite != nil {
		m["favorite"] = *f.Favorite
	}
	if f.Hidden != nil {
		m["hidden"] = *f.Hidden
	}
	if f.Note != nil {
		m["note"] = *f.Note
	}
	if f.Rating != nil {
		m["rating"] = *f.Rating
	}
	return m
}

type metaSetArgs struct {
	Lib     string     `json:"lib"`
	Entry   string     `json:"entry,omitempty"`
	Content string     `json:"content,omitempty"`
	Fields  metaFields `json:"fields"`
}

type metaSetResult struct {
	Scope  string     `json:"scope"` // entry or content
	UUID   string     `json:"uuid"`
	Path   string     `json:"path,omitempty"` // the entry's, for an entry
	Fields metaFields `json:"fields"`
}

type queryArgs struct {
	Lib   string `json:"lib"`
	Model string `json:"model"`
}

// eventDoc is an actors.Event as `lsync watch` prints it.
type eventDoc struct {
	Type    string    `json:"type"`
	Time    time.Time `json:"time"`
	Library string    `json:"library,omitempty"`
	Peer    string    `json:"peer,omitempty"`
	Model   string    `json:"model,omitempty"`
	UUID    string    `json:"uuid,omitempty"`
	Deleted bool      `json:"deleted,omitempty"`
	Count   int       `json:"count,omitempty"`
	Phase   string    `json:"phase,omitempty"`
	Detail  string    `json:"detail,omitempty"`
}

// rowArgs names one row (a tag, an album) of a library.
type rowArgs struct {
	Lib string `json:"lib"`
	Row string `json:"row"` // uuid or exact name
}

// renameArgs renames a library (Row empty) or one of its rows.
type renameArgs struct {
	Lib  string `json:"lib"`
	Row  string `json:"row,omitempty"`
	Name string `json:"name"`
}

type libraryRenameResult struct {
	UUID    string `json:"uuid"`
	Name    string `json:"name"`
	OldName string `json:"old_name"`
}

type tagInfo struct {
	UUID            string `json:"uuid"`
	Name            string `json:"name"`
	Namespace       string `json:"namespace"`
	Color           string `json:"color,omitempty"`
	CreatedByDevice string `json:"created_by_device"`
	CreatedByName   string `json:"created_by_name,omitempty"`
	Contents        int    `json:"contents"` // content identities tagged
	Entries         int    `json:"entries"`  // entries (of any device) with a tagged content
}

type albumInfo struct {
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	Description string `json:"description"`
	Entries     int    `json:"entries"`
}

// renameResult is a renamed tag or album.
type renameResult struct {
	UUID    string `json:"uuid"`
	Name    string `json:"name"`
	OldName string `json:"old_name"`
}

// deletedResult is a deleted tag or album.
type deletedResult struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
}

type metaUnsetArgs struct {
	Lib     string   `json:"lib"`
	Entry   string   `json:"entry,omitempty"`
	Content string   `json:"content,omitempty"`
	Fields  []string `json:"fields"`
}

type metaUnsetResult struct {
	Scope  string   `json:"scope"` // entry or content
	UUID   string   `json:"uuid"`
	Path   string   `json:"path,omitempty"` // the entry's, for an entry
	Fields []string `json:"unset"`
}

type logArgs struct {
	Lib    string `json:"lib"`
	Entry  string `json:"entry,omitempty"`
	Limit  int    `json:"limit,omitempty"`
	Device string `json:"device,omitempty"` // only this device's actions (name or uuid)
	Since  string `json:"since,omitempty"`  // only actions since (parseSince)
}

// auditEntry is one audit_log row as `lsync log` prints it.
type auditEntry struct {
	UUID        string    `json:"uuid"`
	Time        time.Time `json:"time"`
	Device      string    `json:"device"`
	DeviceName  string    `json:"device_name,omitempty"`
	Action      string    `json:"action"`
	TargetModel string    `json:"target_model,omitempty"`
	Target      string    `json:"target,omitempty"`
	TargetName  string    `json:"target_name,omitempty"` // the target's name, where the log knows it
	Detail      string    `json:"detail,omitempty"`
}

func decodeArgs[T any](raw json.RawMessage) (T, error) {
	var v T
	if len(raw) == 0 {
		return v, nil
	}
	err := json.Unmarshal(raw, &v)
	return v, err
}

// memberInfo is one device of a library as `library members` shows it.
type memberInfo struct {
	ID         string `json:"id"`
	Name       string `json:"name,omitempty"`
	Self       bool   `json:"self,omitempty"`
	Partner    bool   `json:"partner"`             // this device syncs the library with it directly
	Connected  bool   `json:"connected,omitempty"` // now
	LastSync   string `json:"last_sync,omitempty"` // the last complete catch-up with it (partners)
	Removed    string `json:"removed,omitempty"`   // "by_this_device" or "by_it": the partnership ended; "revoked": revoked from the library
	StateUpTo  string `json:"state_up_to,omitempty"`
	SharedUpTo string `json:"shared_up_to,omitempty"`
	// CompleteUpTo: up to when this device's copy of its rows is known to
	// be complete (the older of its two watermarks; RFC 3339), "" when
	// nothing of it is yet. An idle device's stays at its last write.
	CompleteUpTo string `json:"complete_up_to,omitempty"`
	// LagSeconds is the age of the oldest change held here that the
	// member does not hold, as its acks and reports say (persistence
	// Lacking): 0 when it is in sync, however idle; absent when it has
	// reported nothing to this device (not a partner, or not yet).
	LagSeconds *float64 `json:"lag_seconds,omitempty"`
	// Filters are what the device takes of the library (selective sync;
	// none: all of it).
	Filters []FilterDoc `json:"filters,omitempty"`
}
