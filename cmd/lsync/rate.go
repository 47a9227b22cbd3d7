package main

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/lsync/lsync/net"
)

// rateForms says which RATE values the CLI takes, for --help and errors.
const rateForms = `bytes per second: a number with an optional unit K, M or G (×1000) or Ki, Mi or Gi (×1024), optionally followed by B and /s (500K, 2M, 1.5MB/s, 64KiB/s, 250000), or 0 or none for no limit`

var (
	rateRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?) ?(?:([kKmMgG])(i?))?(B?)(/s)?$`)
	// bitsRE catches a rate in bits (2Mb, 2Mbit/s, 2Mbps): lsync counts
	// bytes, and a limit 8 times too high is worse than a refusal.
	bitsRE = regexp.MustCompile(`(?i)[0-9.]+ ?[kmg]?i?(b|bit|bits)(/s|ps)?$`)
)

// parseRate reads a RATE (rateForms): bytes per second, 0 for none,
// within net.MinLimit..net.MaxLimit.
func parseRate(s string) (int64, error) {
	t := strings.TrimSpace(s)
	switch strings.ToLower(t) {
	case "0", "none", "unlimited", "off":
		return 0, nil
	}
	m := rateRE.FindStringSubmatch(t)
	if m == nil {
		if bitsRE.MatchString(t) && !strings.HasSuffix(strings.TrimSuffix(t, "/s"), "B") {
			return 0, fmt.Errorf("%q is in bits: want bytes per second (2Mbit/s is 250K)", s)
		}
		return 0, fmt.Errorf("%q: want %s", s, rateForms)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("%q: want %s", s, rateForms)
	}
	base := 1000.0
	if m[3] == "i" {
		base = 1024
	}
	switch strings.ToUpper(m[2]) {
	case "K":
		v *= base
	case "M":
		v *= base * base
	case "G":
		v *= base * base * base
	}
	switch {
	case v == 0:
		return 0, nil
	case v < net.MinLimit:
		return 0, fmt.Errorf("%q is below %d bytes per second (1K); use 0 or none for no limit", s, net.MinLimit)
	case v > net.MaxLimit:
		return 0, fmt.Errorf("%q is above 1000G, the largest limit; use 0 or none for no limit", s)
	}
	return int64(math.Round(v)), nil
}

// formatRate prints bytes per second in decimal units, as parseRate
// reads them back ("1.5 MB/s").
func formatRate(v float64) string {
	v = max(v, 0)
	units := []string{"B/s", "kB/s", "MB/s", "GB/s", "TB/s"}
	i := 0
	for v >= 999.95 && i < len(units)-1 {
		v /= 1000
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B/s", v)
	}
	s := strconv.FormatFloat(v, 'f', 1, 64)
	return strings.TrimSuffix(s, ".0") + " " + units[i]
}

// formatLimit is formatRate for a limit: 0 is "none".
func formatLimit(v int64) string {
	if v == 0 {
		return "none"
	}
	return formatRate(float64(v))
}
