package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
)

// --compare FILE: a change's effect in one command. The run's scenarios
// are printed beside those of a saved --json report, figure by figure,
// with the ratio now ÷ then (below 1: faster, smaller).

// loadReport reads a report saved with --json.
func loadReport(path string) (*report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--compare: %w", err)
	}
	var r report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("--compare %s: not a bench --json report: %w", path, err)
	}
	return &r, nil
}

// writeComparison prints, for every scenario in both reports, each figure
// then and now and their ratio; scenarios in one report only are named.
func writeComparison(w io.Writer, then, now *report, thenName string) {
	fmt.Fprintf(w, "\ncompared with %s (%s, %s):\n", thenName, then.StartedAt.Format("2006-01-02 15:04"), then.Command)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tfigure\tthen\tnow\tnow ÷ then\t")
	old := map[string]scenarioResult{}
	for _, s := range then.Scenarios {
		old[s.Name] = s
	}
	var missing []string
	for _, s := range now.Scenarios {
		o, ok := old[s.Name]
		if !ok {
			missing = append(missing, s.Name+" (not in "+thenName+")")
			continue
		}
		delete(old, s.Name)
		for _, f := range compareFigures(o, s) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", s.Name, f.name, f.then, f.now, f.ratio)
		}
	}
	tw.Flush()
	for name := range old {
		missing = append(missing, name+" (not in this run)")
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		fmt.Fprintf(w, "not compared: %s\n", strings.Join(missing, ", "))
	}
}

type figure struct{ name, then, now, ratio string }

// compareFigures lists the figures of one scenario then and now.
func compareFigures(then, now scenarioResult) []figure {
	var out []figure
	// A zero figure was not measured (a baseline left out, a phase one
	// run did not have): shown as "-", with no ratio.
	show := func(v float64, unit string) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f%s", v, unit)
	}
	add := func(name, unit string, a, b float64) {
		if a == 0 && b == 0 {
			return
		}
		r := "-"
		if a != 0 && b != 0 {
			r = fmt.Sprintf("%.2f×", b/a)
		}
		out = append(out, figure{name, show(a, unit), show(b, unit), r})
	}
	add("wall", " s", then.WallSecs, now.WallSecs)
	add("× raw insert", "", then.XRaw, now.XRaw)
	add("records/s", "", then.RecordsPerSec, now.RecordsPerSec)
	add("wire", " MB", then.WireBytes/1e6, now.WireBytes/1e6)
	add("joiner RSS", " MB", then.JoinerRSSMB, now.JoinerRSSMB)
	add("joiner CPU", " s", then.JoinerCPU, now.JoinerCPU)
	add("server CPU", " s", then.ServerCPU, now.ServerCPU)
	phases := map[string]bool{}
	for p := range then.Phases {
		phases[p] = true
	}
	for p := range now.Phases {
		phases[p] = true
	}
	for _, p := range slices.Sorted(func(yield func(string) bool) {
		for p := range phases {
			if !yield(p) {
				return
			}
		}
	}) {
		add("phase "+p, " s", then.Phases[p], now.Phases[p])
	}
	return out
}
