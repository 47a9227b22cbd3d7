package persistence

import "sync"

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
		{Name: "device", Kind: DeviceOwned, Columns: []Column{
			text("name"), text("platform"), integer("created_at"),
		}},
		{Name: "volume", Kind: DeviceOwned, DependsOn: []string{"device"}, Columns: []Column{
			text("name"), text("mount_point"), integer("capacity"), text("fs_type"), integer("created_at"),
		}},
		{Name: "location", Kind: DeviceOwned, DependsOn: []string{"device", "volume"}, derived: derivedLocation, Columns: []Column{
			ref("volume_uuid", "volume"), required(text("path")), text("name"), integer("created_at"),
		}},
		{Name: "entry", Kind: DeviceOwned, DependsOn: []string{"location"}, derived: derivedEntry, Columns: []Column{
			required(ref("location_uuid", "location")), ref("parent_uuid", "entry"), required(text("name")),
			integer("kind"), text("extension"), integer("size"), integer("mtime"),
			uref("content_uuid", "content_identity"),
		}},
		{Name: "audit_log", Kind: DeviceOwned, DependsOn: []string{"device"}, Columns: []Column{
			text("action"), text("target_model"), Column{Name: "target_uuid", Type: TypeUUID}, text("detail"), integer("created_at"),
		}},
		{Name: "entry_metadata", Kind: DeviceOwned, DependsOn: []string{"entry"}, DeterministicFrom: []string{"entry_uuid"}, Columns: []Column{
			required(ref("entry_uuid", "entry")), boolean("favorite"), boolean("hidden"), text("note"),
		}},

		// Shared.
		{Name: "content_identity", Kind: Shared, DeterministicFrom: []string{"content_hash"}, Columns: []Column{
			required(text("content_hash")), integer("size"), text("kind"), integer("created_at"),
		}},
		{Name: "tag", Kind: Shared, Columns: []Column{
			text("canonical_name"), text("namespace"), text("display_name"), text("formal_name"),
			text("abbreviation"), {Name: "aliases", Type: TypeJSON}, text("color"), text("icon"),
			text("tag_type"), text("privacy_level"), integer("created_at"), uref("created_by_device", "device"),
		}},
		{Name: "tag_relationship", Kind: Shared, DependsOn: []string{"tag"}, derived: derivedTagEdge,
			DeterministicFrom: []string{"parent_tag_uuid", "child_tag_uuid"}, Columns: []Column{
				required(uref("parent_tag_uuid", "tag")), required(uref("child_tag_uuid", "tag")),
				text("relationship_type"), real("strength"), integer("created_at"),
			}},
		{Name: "album", Kind: Shared, Columns: []Column{
			text("name"), text("description"), integer("created_at"), uref("created_by_device", "device"),
		}},
		{Name: "album_entry", Kind: Shared, DependsOn: []string{"album", "entry"},
			DeterministicFrom: []string{"album_uuid", "entry_uuid"}, Columns: []Column{
				required(uref("album_uuid", "album")), required(uref("entry_uuid", "entry")),
				integer("added_at"), uref("added_by_device", "device"),
			}},
		{Name: "user_metadata", Kind: Shared, DependsOn: []string{"content_identity"},
			DeterministicFrom: []string{"content_uuid"}, Columns: []Column{
				required(uref("content_uuid", "content_identity")), boolean("favorite"), boolean("hidden"),
				text("note"), integer("rating"),
			}},
		{Name: "user_metadata_tag", Kind: Shared, DependsOn: []string{"user_metadata", "tag"},
			DeterministicFrom: []string{"user_metadata_uuid", "tag_uuid"}, Columns: []Column{
				required(uref("user_metadata_uuid", "user_metadata")), required(uref("tag_uuid", "tag")),
				text("applied_context"), real("confidence"), text("source"), integer("created_at"),
				uref("device_uuid", "device"),
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
