package persistence

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// SetName renames the library on this device (its library.json).
func (l *Library) SetName(name string) error {
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	l.pub.Lock()
	meta := l.meta
	l.pub.Unlock()
	meta.Name = name
	if err := writeMeta(l.dir, meta); err != nil {
		return fmt.Errorf("rename library: %w", err)
	}
	l.pub.Lock()
	l.meta = meta
	l.pub.Unlock()
	return nil
}

// RenameFolder renames the library at dir, which is not open (its
// library.json). An open library is renamed with SetName.
func RenameFolder(dir, name string) error {
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		return fmt.Errorf("rename library: %w", err)
	}
	var meta Meta
	if err := json.Unmarshal(b, &meta); err != nil {
		return fmt.Errorf("rename library: %s: %w", MetaFile, err)
	}
	meta.Name = name
	if err := writeMeta(dir, meta); err != nil {
		return fmt.Errorf("rename library: %w", err)
	}
	return nil
}
