package persistence

import (
	"sync"

	"github.com/lsync/lsync/messages"
)

// Model names: the names on the wire (StateChange.Model, SharedChange.Model)
// and of the tables. Use these, never the literals.
const (
	// Device-owned.
	ModelDevice        = "device"
	ModelVolume        = "volume"
	ModelLocation      = "location"
	ModelEntry         = "entry"
	ModelAuditLog      = "audit_log"
	ModelEntryMetadata = "entry_metadata"
	// ModelSyncFilter is what its owner takes of the library (selective
	// sync, filter.go): one row per source it filters (source_uuid null:
	// the default), the filter as JSON.
	ModelSyncFilter = "sync_filter"

	// Shared.
	ModelContentIdentity = "content_identity"
	ModelTag             = "tag"
	ModelTagRelationship = "tag_relationship"
	ModelAlbum           = "album"
	ModelAlbumEntry      = "album_entry"
	ModelUserMetadata    = "user_metadata"
	ModelUserMetadataTag = "user_metadata_tag"
	// ModelMember says a device was removed from the library (sync-remove
	// on any member, or it left), or is back (a sync-setup by hand), by
	// which device and when: one row per device, the newest word wins.
	ModelMember = "member"
	// ModelRevocation says a device was revoked from the library (a lost
	// or stolen device), by which member, when and why (revoke.go): one
	// row per (device, revoking member), never deleted.
	ModelRevocation = "revocation"
)

// Entry kinds (entry.kind).
const (
	EntryFile      = 0
	EntryDirectory = 1
	EntrySymlink   = 2
)

// Limits of the default models' text columns, in bytes (doc.go, "Limits").
const (
	maxShort = 256      // identifiers and enums: platform, extension, color, kind, source ...
	maxName  = 1 << 10  // names: of devices, volumes, locations, entries, tags, albums
	maxPath  = 4 << 10  // paths: a location's path, a volume's mount point (PATH_MAX)
	maxJSON  = 16 << 10 // JSON lists: a tag's aliases
	maxNote  = 64 << 10 // free text: notes, descriptions, audit details
	maxHash  = maxShort // content hashes (hex or algorithm:digest)
)

// DefaultModels returns the declarations of every model of DESIGN.md §3,
// with the built-in hooks for derived caches attached.
func DefaultModels() []Model {
	sized := func(n string, limit int) Column { return Column{Name: n, Type: TypeText, MaxBytes: limit} }
	short := func(n string) Column { return sized(n, maxShort) }
	name := func(n string) Column { return sized(n, maxName) }
	path := func(n string) Column { return sized(n, maxPath) }
	note := func(n string) Column { return sized(n, maxNote) }
	integer := func(n string) Column { return Column{Name: n, Type: TypeInt} }
	real := func(n string) Column { return Column{Name: n, Type: TypeReal} }
	boolean := func(n string) Column { return Column{Name: n, Type: TypeBool} }
	uref := func(n, model string) Column { return Column{Name: n, Type: TypeUUID, Ref: model} }
	ref := func(n, model string) Column { return Column{Name: n, Type: TypeRef, Ref: model} }
	required := func(c Column) Column { c.Required = true; return c }

	return []Model{
		// Device-owned.
		{Name: ModelDevice, Kind: DeviceOwned, Columns: []Column{
			name("name"), short("platform"), integer("created_at"),
		}},
		{Name: ModelVolume, Kind: DeviceOwned, DependsOn: []string{ModelDevice}, Columns: []Column{
			name("name"), path("mount_point"), integer("capacity"), short("fs_type"), integer("created_at"),
		}},
		{Name: ModelLocation, Kind: DeviceOwned, DependsOn: []string{ModelDevice, ModelVolume}, derived: derivedLocation, Columns: []Column{
			ref("volume_uuid", ModelVolume), required(path("path")), name("name"), integer("created_at"),
		}},
		{Name: ModelEntry, Kind: DeviceOwned, DependsOn: []string{ModelLocation}, derived: derivedEntry, Columns: []Column{
			required(ref("location_uuid", ModelLocation)), ref("parent_uuid", ModelEntry), required(name("name")),
			integer("kind"), short("extension"), integer("size"), integer("mtime"),
			uref("content_uuid", ModelContentIdentity),
		}},
		{Name: ModelAuditLog, Kind: DeviceOwned, DependsOn: []string{ModelDevice}, Columns: []Column{
			short("action"), short("target_model"), Column{Name: "target_uuid", Type: TypeUUID}, note("detail"), integer("created_at"),
		}},
		{Name: ModelEntryMetadata, Kind: DeviceOwned, DependsOn: []string{ModelEntry}, DeterministicFrom: []string{"entry_uuid"}, Columns: []Column{
			required(ref("entry_uuid", ModelEntry)), boolean("favorite"), boolean("hidden"), note("note"),
		}},
		{Name: ModelSyncFilter, Kind: DeviceOwned, DependsOn: []string{ModelDevice}, Columns: []Column{
			Column{Name: "source_uuid", Type: TypeUUID, Ref: ModelDevice}, {Name: "filter", Type: TypeJSON, MaxBytes: maxJSON},
			integer("updated_at"),
		}},

		// Shared.
		{Name: ModelContentIdentity, Kind: Shared, DeterministicFrom: []string{"content_hash"}, Columns: []Column{
			required(sized("content_hash", maxHash)), integer("size"), short("kind"), integer("created_at"),
		}},
		{Name: ModelTag, Kind: Shared, Columns: []Column{
			name("canonical_name"), name("namespace"), name("display_name"), name("formal_name"),
			short("abbreviation"), {Name: "aliases", Type: TypeJSON, MaxBytes: maxJSON}, short("color"), short("icon"),
			short("tag_type"), short("privacy_level"), integer("created_at"), uref("created_by_device", ModelDevice),
		}},
		{Name: ModelTagRelationship, Kind: Shared, DependsOn: []string{ModelTag}, derived: derivedTagEdge,
			DeterministicFrom: []string{"parent_tag_uuid", "child_tag_uuid"}, Columns: []Column{
				required(uref("parent_tag_uuid", ModelTag)), required(uref("child_tag_uuid", ModelTag)),
				short("relationship_type"), real("strength"), integer("created_at"),
			}},
		{Name: ModelAlbum, Kind: Shared, Columns: []Column{
			name("name"), note("description"), integer("created_at"), uref("created_by_device", ModelDevice),
		}},
		{Name: ModelAlbumEntry, Kind: Shared, DependsOn: []string{ModelAlbum, ModelEntry},
			DeterministicFrom: []string{"album_uuid", "entry_uuid"}, Columns: []Column{
				required(uref("album_uuid", ModelAlbum)), required(uref("entry_uuid", ModelEntry)),
				integer("added_at"), uref("added_by_device", ModelDevice),
			}},
		{Name: ModelUserMetadata, Kind: Shared, DependsOn: []string{ModelContentIdentity},
			DeterministicFrom: []string{"content_uuid"}, Columns: []Column{
				required(uref("content_uuid", ModelContentIdentity)), boolean("favorite"), boolean("hidden"),
				note("note"), integer("rating"), // rating: 0 to 5 (actors.MinRating, MaxRating)
			}},
		{Name: ModelUserMetadataTag, Kind: Shared, DependsOn: []string{ModelUserMetadata, ModelTag},
			DeterministicFrom: []string{"user_metadata_uuid", "tag_uuid"}, Columns: []Column{
				required(uref("user_metadata_uuid", ModelUserMetadata)), required(uref("tag_uuid", ModelTag)),
				name("applied_context"), real("confidence"), short("source"), integer("created_at"),
				uref("device_uuid", ModelDevice),
			}},
		// A member row is signed by the device that writes it (by): no
		// member removes another in a third device's name (issue 25).
		// departed: the device left by itself (by recorded it).
		{Name: ModelMember, Kind: Shared, DeterministicFrom: []string{"device_uuid"}, SignedBy: "by", Columns: []Column{
			required(uref("device_uuid", ModelDevice)), boolean("removed"), uref("by", ModelDevice), integer("at"),
			boolean("departed"), short(sigColumn),
		}},
		// A revocation row is signed by the member that writes it (by),
		// like a member row (issue 24).
		{Name: ModelRevocation, Kind: Shared, DeterministicFrom: []string{"device_uuid", "by"}, SignedBy: "by", Columns: []Column{
			required(uref("device_uuid", ModelDevice)), required(uref("by", ModelDevice)), integer("at"), sized("reason", maxName),
			boolean("remove_rows"), short(sigColumn),
		}},
	}
}

var defaultRegistry = sync.OnceValue(func() *Registry {
	r, err := NewRegistry(DefaultModels()...)
	if err != nil {
		panic("persistence: default registry: " + err.Error())
	}
	return r
})

// DefaultRegistry declares every model of DESIGN.md §3.
func DefaultRegistry() *Registry { return defaultRegistry() }

// A page of shared state leaves off the uuids that derive from their
// record's fields (messages.Changes): both ends derive them by the
// default models' rule, the one every library uses.
func init() {
	messages.SetUUIDDeriver(func(model string, fields map[string]any) (messages.UUID, bool) {
		return DefaultRegistry().DeterministicUUID(model, fields)
	})
}
