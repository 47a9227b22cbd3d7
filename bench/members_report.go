package main

import (
	"fmt"
	"io"
	"slices"
)

// membersGrowth is a members-N run against the smallest run of the same
// topology: messages per change should grow at most linearly with the
// members (issue 23: at most 1.5 times the members' ratio).
type membersGrowth struct {
	Topology   string  `json:"topology"`
	From, To   int     `json:"-"`
	FromName   string  `json:"from"`
	ToName     string  `json:"to"`
	MembersX   float64 `json:"members_x"`
	MsgsX      float64 `json:"msgs_per_change_x"`
	NoPingsX   float64 `json:"msgs_per_change_without_pings_x"`
	BytesX     float64 `json:"bytes_per_change_x"`
	NetMsgsX   float64 `json:"net_msgs_per_change_x,omitempty"` // less the idle rate, when both runs measured it
	Bound      float64 `json:"bound_x"`                         // 1.5 × MembersX
	Met        bool    `json:"met"`
	FromMsgs   float64 `json:"from_msgs_per_change"`
	ToMsgs     float64 `json:"to_msgs_per_change"`
	FromBytes  float64 `json:"from_bytes_per_change"`
	ToBytes    float64 `json:"to_bytes_per_change"`
	FromLastMs float64 `json:"from_last_member_p50_ms"`
	ToLastMs   float64 `json:"to_last_member_p50_ms"`
}

// membersGrowthOf compares each complete run (every change everywhere)
// with the smallest complete run of its topology.
func membersGrowthOf(runs []*membersResult) []membersGrowth {
	var out []membersGrowth
	byTop := map[string][]*membersResult{}
	var tops []string
	for _, r := range runs {
		if r.Status != "ok" || r.Arrived != r.Changes || r.MsgsPerChange <= 0 {
			continue
		}
		if _, ok := byTop[r.Topology]; !ok {
			tops = append(tops, r.Topology)
		}
		byTop[r.Topology] = append(byTop[r.Topology], r)
	}
	for _, t := range tops {
		rs := byTop[t]
		slices.SortStableFunc(rs, func(a, b *membersResult) int { return a.Members - b.Members })
		base := rs[0]
		for _, r := range rs[1:] {
			if r.Members == base.Members {
				continue
			}
			g := membersGrowth{Topology: t, From: base.Members, To: r.Members, FromName: base.Name, ToName: r.Name,
				MembersX: float64(r.Members) / float64(base.Members), MsgsX: r.MsgsPerChange / base.MsgsPerChange,
				FromMsgs: base.MsgsPerChange, ToMsgs: r.MsgsPerChange, FromBytes: base.BytesPerChange, ToBytes: r.BytesPerChange,
				FromLastMs: base.LastP50Ms, ToLastMs: r.LastP50Ms}
			if base.MsgsNoPings > 0 {
				g.NoPingsX = r.MsgsNoPings / base.MsgsNoPings
			}
			if base.BytesPerChange > 0 {
				g.BytesX = r.BytesPerChange / base.BytesPerChange
			}
			if base.NetMsgsPerChange > 0 && r.NetMsgsPerChange > 0 {
				g.NetMsgsX = r.NetMsgsPerChange / base.NetMsgsPerChange
			}
			g.Bound = 1.5 * g.MembersX
			g.Met = g.MsgsX <= g.Bound
			out = append(out, g)
		}
	}
	return out
}

// membersTargets: every change reaches every member, in each run; and
// messages per change grow at most linearly with the members.
func membersTargets(runs []*membersResult, growth []membersGrowth) []targetCheck {
	var ts []targetCheck
	for _, r := range runs {
		if r.Changes == 0 || r.SetupSecs == 0 {
			continue // it failed before measuring
		}
		got := fmt.Sprintf("%d/%d", r.Arrived, r.Changes)
		if r.Arrived > 0 {
			got += fmt.Sprintf(", last member p99 %.0f ms", r.LastP99Ms)
		}
		ts = append(ts, targetCheck{r.Name + ": every change on every member", "all", got, r.Arrived == r.Changes})
	}
	for _, g := range growth {
		ts = append(ts, targetCheck{fmt.Sprintf("members: msgs/change %d → %d (%s)", g.From, g.To, g.Topology), fmt.Sprintf("≤ %.2f×", g.Bound),
			fmt.Sprintf("%.2f× (%.0f → %.0f) for %.2f× the members", g.MsgsX, g.FromMsgs, g.ToMsgs, g.MembersX), g.Met})
	}
	return ts
}

// writeMembers prints the members-N runs and their growth.
func writeMembers(w io.Writer, runs []*membersResult, growth []membersGrowth) {
	for i, r := range runs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		r.write(w)
	}
	for _, g := range growth {
		fmt.Fprintf(w, "members growth (%s): %s ÷ %s: %.2f× the members, %.2f× the msgs/change (%.1f → %.1f; at most linear: ≤ %.2f×), %.2f× the bytes/change",
			g.Topology, g.ToName, g.FromName, g.MembersX, g.MsgsX, g.FromMsgs, g.ToMsgs, g.Bound, g.BytesX)
		if g.NoPingsX > 0 {
			fmt.Fprintf(w, "; without pings %.2f×", g.NoPingsX)
		}
		if g.NetMsgsX > 0 {
			fmt.Fprintf(w, "; less idle traffic %.2f×", g.NetMsgsX)
		}
		fmt.Fprintf(w, "; last member p50 %.0f → %.0f ms\n", g.FromLastMs, g.ToLastMs)
	}
}

func (r *membersResult) write(w io.Writer) {
	fmt.Fprintf(w, "%s: %d members, %s topology (seed %d), %d partnerships (%d to %d partners each)", r.Name, r.Members, r.Topology, r.Seed,
		r.Partnerships, r.DegreeMin, r.DegreeMax)
	if r.Status != "ok" {
		fmt.Fprintf(w, " — %s", r.Status)
	}
	fmt.Fprintln(w)
	if r.SetupSecs == 0 {
		return
	}
	fmt.Fprintf(w, "  setup:        %.1f s (%s); a pairing median %.0f ms (max %.0f), a join median %.0f ms (max %.0f), %d join levels\n",
		r.SetupSecs, phasesLabel(r.SetupPhases), r.PairP50Ms, r.PairMaxMs, r.JoinP50Ms, r.JoinMaxMs, r.JoinLevels)
	if r.WarmUpSecs > 0 {
		fmt.Fprintf(w, "  warm-up:      a tag on each member, on every member within %.0f ms; quiet after %.1f s\n", r.WarmUpLastMs, r.WarmUpSecs)
	}
	if r.WindowSecs == 0 && r.Arrived == 0 {
		return
	}
	fmt.Fprintf(w, "  changes:      %d tags on random members at %g/s: %d/%d on every member", r.Changes, r.Rate, r.Arrived, r.Changes)
	if r.ByPoll > 0 {
		fmt.Fprintf(w, " (%d arrivals timed by a query poll)", r.ByPoll)
	}
	fmt.Fprintln(w)
	for _, m := range r.Missing[:min(len(r.Missing), 5)] {
		fmt.Fprintf(w, "    %s\n", m)
	}
	fmt.Fprintf(w, "  last member:  p50 %.0f ms, p99 %.0f ms, max %.0f ms after the write on its origin", r.LastP50Ms, r.LastP99Ms, r.LastMaxMs)
	if r.FromCLI > 0 {
		fmt.Fprintf(w, " (%d timed from the CLI's return: the origin's stream missed the write)", r.FromCLI)
	}
	fmt.Fprintln(w)
	if r.WindowSecs > 0 {
		fmt.Fprintf(w, "  per change:   %.1f msgs (%.1f without pings), %.0f bytes out, all daemons (over %.1f s, periodic catch-ups included)",
			r.MsgsPerChange, r.MsgsNoPings, r.BytesPerChange, r.WindowSecs)
		if r.IdleSecs > 0 {
			fmt.Fprintf(w, "; less the idle rate %.1f msgs, %.0f bytes", r.NetMsgsPerChange, r.NetBytesPerChange)
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "  by type:      %s\n", topTypes(r.MsgsByType, 6))
	}
	if r.IdleSecs > 0 {
		fmt.Fprintf(w, "  idle:         %.0f msgs, %.0f bytes a minute (over %.0f s: %s)\n", r.IdleMsgsPerMin, r.IdleBytesPerMin, r.IdleSecs, topTypes(r.IdleMsgsByType, 4))
	}
	if r.RSSSumMB > 0 {
		fmt.Fprintf(w, "  peak RSS:     largest daemon %.0f MB (device %d), all %d daemons %.0f MB (now %.0f MB)\n", r.RSSMaxMB, r.RSSMaxDevice, r.Members, r.RSSSumMB, r.RSSNowSumMB)
	}
}
