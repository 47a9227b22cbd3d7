package persistence

import "sync"

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

	// Shared.
	ModelContentIdentity = "content_identity"
	ModelTag             = "tag"
	ModelTagRelationship = "tag_relationship"
	ModelAlbum           = "album"
	ModelAlbumEntry      = "album_entry"
	ModelUserMetadata    = "user_metadata"
	ModelUserMetadataTag = "user_metadata_tag"
)

// Entry kinds (entry.kind).
const (
	EntryFile      = 0
	EntryDirectory = 1
	EntrySymlink   = 2
)

// DefaultModels returns the declarations of every model of DESIGN.md §3,
// with the built-in hooks for derived caches attached.
func DefaultModels() []Model {
	text := func(n string) Column { return Column{Name: n, Type: TypeText} }
	integer := func(n string) Column { return Column{Name: n, Type: TypeInt} }
	real := func(n string) Column { return Column{Name: n, Type: TypeReal} }
	boolean := func(n string) Column { return Column{Name: n, Type: TypeBool} }
	uref := func(n, model string) Column { return Column{Name: n, Type: TypeUUID, Ref: model} }
	ref := func(n, model string) Column { return Column{Name: n, Type: TypeRef, Ref: model} }
	required := func(c Column) Column { c.Required = true; return c }

	return []Model{
		// Device-owned.
		{Name: ModelDevice, Kind: DeviceOwned, Columns: []Column{
			text("name"), text("platform"), integer("created_at"),
		}},
		{Name: ModelVolume, Kind: DeviceOwned, DependsOn: []string{ModelDevice}, Columns: []Column{
			text("name"), text("mount_point"), integer("capacity"), text("fs_type"), integer("created_at"),
		}},
		{Name: ModelLocation, Kind: DeviceOwned, DependsOn: []string{ModelDevice, ModelVolume}, derived: derivedLocation, Columns: []Column{
			ref("volume_uuid", ModelVolume), required(text("path")), text("name"), integer("created_at"),
		}},
		{Name: ModelEntry, Kind: DeviceOwned, DependsOn: []string{ModelLocation}, derived: derivedEntry, Columns: []Column{
			required(ref("location_uuid", ModelLocation)), ref("parent_uuid", ModelEntry), required(text("name")),
			integer("kind"), text("extension"), integer("size"), integer("mtime"),
			uref("content_uuid", ModelContentIdentity),
		}},
		{Name: ModelAuditLog, Kind: DeviceOwned, DependsOn: []string{ModelDevice}, Columns: []Column{
			text("action"), text("target_model"), Column{Name: "target_uuid", Type: TypeUUID}, text("detail"), integer("created_at"),
		}},
		{Name: ModelEntryMetadata, Kind: DeviceOwned, DependsOn: []string{ModelEntry}, DeterministicFrom: []string{"entry_uuid"}, Columns: []Column{
			required(ref("entry_uuid", ModelEntry)), boolean("favorite"), boolean("hidden"), text("note"),
		}},

		// Shared.
		{Name: ModelContentIdentity, Kind: Shared, DeterministicFrom: []string{"content_hash"}, Columns: []Column{
			required(text("content_hash")), integer("size"), text("kind"), integer("created_at"),
		}},
		{Name: ModelTag, Kind: Shared, Columns: []Column{
			text("canonical_name"), text("namespace"), text("display_name"), text("formal_name"),
			text("abbreviation"), {Name: "aliases", Type: TypeJSON}, text("color"), text("icon"),
			text("tag_type"), text("privacy_level"), integer("created_at"), uref("created_by_device", ModelDevice),
		}},
		{Name: ModelTagRelationship, Kind: Shared, DependsOn: []string{ModelTag}, derived: derivedTagEdge,
			DeterministicFrom: []string{"parent_tag_uuid", "child_tag_uuid"}, Columns: []Column{
				required(uref("parent_tag_uuid", ModelTag)), required(uref("child_tag_uuid", ModelTag)),
				text("relationship_type"), real("strength"), integer("created_at"),
			}},
		{Name: ModelAlbum, Kind: Shared, Columns: []Column{
			text("name"), text("description"), integer("created_at"), uref("created_by_device", ModelDevice),
		}},
		{Name: ModelAlbumEntry, Kind: Shared, DependsOn: []string{ModelAlbum, ModelEntry},
			DeterministicFrom: []string{"album_uuid", "entry_uuid"}, Columns: []Column{
				required(uref("album_uuid", ModelAlbum)), required(uref("entry_uuid", ModelEntry)),
				integer("added_at"), uref("added_by_device", ModelDevice),
			}},
		{Name: ModelUserMetadata, Kind: Shared, DependsOn: []string{ModelContentIdentity},
			DeterministicFrom: []string{"content_uuid"}, Columns: []Column{
				required(uref("content_uuid", ModelContentIdentity)), boolean("favorite"), boolean("hidden"),
				text("note"), integer("rating"),
			}},
		{Name: ModelUserMetadataTag, Kind: Shared, DependsOn: []string{ModelUserMetadata, ModelTag},
			DeterministicFrom: []string{"user_metadata_uuid", "tag_uuid"}, Columns: []Column{
				required(uref("user_metadata_uuid", ModelUserMetadata)), required(uref("tag_uuid", ModelTag)),
				text("applied_context"), real("confidence"), text("source"), integer("created_at"),
				uref("device_uuid", ModelDevice),
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
