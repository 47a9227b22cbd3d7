package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// versionInfo is what `lsync version` prints. Every field comes from the
// build: `go build` stamps the module version and the VCS revision into the
// binary by default (no -ldflags needed); a test binary or a build with
// -buildvcs=false has none, and says so.
type versionInfo struct {
	Version      string `json:"version"`                 // module version, "(devel)" when unknown
	Revision     string `json:"revision,omitempty"`      // VCS commit
	RevisionTime string `json:"revision_time,omitempty"` // commit time, RFC 3339
	Modified     bool   `json:"modified"`                // the work tree had local changes
	Go           string `json:"go"`                      // toolchain version
	Platform     string `json:"platform"`                // GOOS/GOARCH
}

func buildVersion() versionInfo {
	v := versionInfo{Version: "(devel)", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.RevisionTime = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this lsync binary",
		Long: `Print the module version, the VCS revision it was built from and the Go
toolchain. All of it is read from the binary's build information, which
"go build" records by itself (no -ldflags needed); a build without VCS
information (-buildvcs=false, outside a repository, or in a linked git
worktree) prints no revision.
No daemon is needed.`,
		Example: `  lsync version
  lsync --json version`,
		Args: args(cobra.NoArgs),
		RunE: g.runE(func(cmd *cobra.Command, _ []string) error {
			v := buildVersion()
			return g.output(v, func(w io.Writer) {
				fmt.Fprintf(w, "lsync %s\n", v.Version)
				if v.Revision != "" {
					mod := ""
					if v.Modified {
						mod = " (modified)"
					}
					fmt.Fprintf(w, "revision %s%s", v.Revision, mod)
					if v.RevisionTime != "" {
						fmt.Fprintf(w, " of %s", v.RevisionTime)
					}
					fmt.Fprintln(w)
				}
				fmt.Fprintf(w, "%s %s\n", v.Go, v.Platform)
			})
		}),
	}
}

// addCompletionCmd adds cobra's `completion SHELL` command now (cobra
// would add it lazily when executing), so that it is documented like every
// other command.
func addCompletionCmd(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		c.Short = "Print a shell completion script (bash, zsh, fish or powershell)"
		c.Example = `  source <(lsync completion bash)
  lsync completion zsh > "${fpath[1]}/_lsync"
  lsync completion fish > ~/.config/fish/completions/lsync.fish`
		c.Args = nil // groupRunE reports an unknown shell
		c.RunE = groupRunE
		for _, s := range c.Commands() {
			s.Example = "  lsync completion " + s.Name() + " > lsync-completion." + s.Name()
		}
	}
}
