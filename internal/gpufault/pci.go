package gpufault

import (
	"fmt"
	"strconv"
	"strings"
)

// NormalizePCIBusID returns a PCI address in the form Linux uses in sysfs
// (domain:bus:device.function in lower-case hex, the domain at least four
// digits: "0000:3b:00.0"), which is also what NVML's and DCGM's addresses
// become once the 8-digit domain is shortened. It accepts every form NVIDIA's
// tools print for a GPU:
//
//   - the kernel log's "0000:3b:00" and "PCI:0000:3b:00" (no function: a GPU
//     is function 0);
//   - NVML's and dcgm-exporter's "00000000:3B:00.0";
//   - "0000:3b:00.0" itself, and the oldest drivers' "3b:00" (bus:device in
//     domain 0).
//
// ok is false for anything else, including a bus above 0xff, a device above
// 0x1f or a function above 7.
func NormalizePCIBusID(s string) (string, bool) {
	s = strings.TrimSpace(s)
	if len(s) >= 4 && strings.EqualFold(s[:4], "PCI:") {
		s = s[4:]
	}
	function := uint64(0)
	if i := strings.LastIndexByte(s, '.'); i >= 0 {
		f, ok := parseHex(s[i+1:], 1, 0x7)
		if !ok {
			return "", false
		}
		function, s = f, s[:i]
	}
	parts := strings.Split(s, ":")
	var domain, bus, device uint64
	var ok1, ok2, ok3 bool
	switch len(parts) {
	case 3:
		domain, ok1 = parseHex(parts[0], 8, 0xffffffff)
		bus, ok2 = parseHex(parts[1], 4, 0xff)
		device, ok3 = parseHex(parts[2], 4, 0x1f)
	case 2:
		ok1 = true
		bus, ok2 = parseHex(parts[0], 4, 0xff)
		device, ok3 = parseHex(parts[1], 4, 0x1f)
	default:
		return "", false
	}
	if !ok1 || !ok2 || !ok3 {
		return "", false
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, device, function), true
}

// parseHex reads 1 to maxDigits hex digits (nothing else) with a value of at
// most limit.
func parseHex(s string, maxDigits int, limit uint64) (uint64, bool) {
	if s == "" || len(s) > maxDigits {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if !isHexDigit(s[i]) {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil || v > limit {
		return 0, false
	}
	return v, true
}

func isHexDigit(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
