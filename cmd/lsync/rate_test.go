package main

import (
	"strings"
	"testing"
)

func TestParseRate(t *testing.T) {
	for in, want := range map[string]int64{
		"250000": 250_000, "1000": 1000, "500K": 500_000, "500k": 500_000, "500kB": 500_000, "500KB/s": 500_000,
		"2M": 2_000_000, "1.5MB/s": 1_500_000, "1.5 MB/s": 1_500_000, "64KiB/s": 65_536, "64Ki": 65_536,
		"1Mi": 1 << 20, "1GiB/s": 1 << 30, "3G": 3_000_000_000, "1000G": 1_000_000_000_000, "1500B/s": 1500,
		"1234/s": 1234, "0": 0, "none": 0, "None": 0, "off": 0, "unlimited": 0, "0K": 0, " 2M ": 2_000_000,
	} {
		got, err := parseRate(in)
		if err != nil || got != want {
			t.Errorf("parseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"fast":     "want bytes per second: a number with an optional unit K, M or G",
		"":         "want bytes per second",
		"-5":       "want bytes per second",
		"1e6":      "want bytes per second",
		"1.5T":     "want bytes per second",
		"2 M B":    "want bytes per second",
		"64KIB":    "want bytes per second",
		"2Mbit/s":  "is in bits",
		"2Mb":      "is in bits",
		"2mbps":    "is in bits",
		"500kb/s":  "is in bits",
		"999":      "below 1000 bytes per second",
		"500B/s":   "below 1000 bytes per second",
		"0.0001":   "below 1000 bytes per second",
		"1001G":    "above 1000G",
		"1000000G": "above 1000G",
	} {
		_, err := parseRate(in)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("parseRate(%q): %v, want an error with %q", in, err, want)
		}
	}
}

func TestFormatRate(t *testing.T) {
	for in, want := range map[float64]string{
		0: "0 B/s", 999: "999 B/s", 1000: "1 kB/s", 1500: "1.5 kB/s", 20_000: "20 kB/s", 19_840.3: "19.8 kB/s",
		999_960: "1 MB/s", 1_500_000: "1.5 MB/s", 2e9: "2 GB/s", -3: "0 B/s",
	} {
		if got := formatRate(in); got != want {
			t.Errorf("formatRate(%v) = %q, want %q", in, got, want)
		}
	}
	if got := formatLimit(0); got != "none" {
		t.Errorf("formatLimit(0) = %q", got)
	}
	// What formatRate prints of a limit, parseRate reads back.
	for _, v := range []int64{1000, 1500, 20_000, 2_000_000, 1_500_000_000} {
		back, err := parseRate(strings.ReplaceAll(formatLimit(v), " ", ""))
		if err != nil || back != v {
			t.Errorf("%d printed %q, read back %d (%v)", v, formatLimit(v), back, err)
		}
	}
}
