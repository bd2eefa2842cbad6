package gpufault

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"syscall"
)

// Unknown stands for a number a log line did not give: a PID, a MIG
// instance, a kernel sequence number or timestamp.
const Unknown = -1

// XIDEvent is one XID report of the NVIDIA driver, as the kernel log shows it.
type XIDEvent struct {
	// PCIBusID is the GPU's address, normalised (NormalizePCIBusID) to the
	// "0000:3b:00.0" form that sysfs, NVML and dcgm-exporter use.
	PCIBusID string
	// UUID is the GPU's UUID when the driver printed it earlier in the same
	// stream ("NVRM: GPU at PCI:…: GPU-…", logged once per GPU before its
	// first XID). Only KmsgScanner fills it.
	UUID string
	// Code is the XID number.
	Code int
	// PID and ProcessName name the process whose channel the XID hit; PID is
	// Unknown and ProcessName empty when the driver printed none or
	// '<unknown>' (for an XID not tied to a channel).
	PID         int
	ProcessName string
	// GPUInstance and ComputeInstance are the MIG instance the driver
	// attributed the XID to ("GPU-I:nn", "GPU-CI:nn"), or Unknown.
	GPUInstance     int
	ComputeInstance int
	// Message is the driver's text after the code (and after pid= and name=).
	Message string
	// Seq is the /dev/kmsg sequence number, or Unknown for other formats.
	Seq int64
	// KernelTimeUsec is the kernel timestamp in microseconds since boot:
	// the /dev/kmsg field or dmesg's "[ seconds.micros]" prefix; Unknown for
	// lines without one (syslog, journal, "dmesg -T").
	KernelTimeUsec int64
	// FromUserspace is set for a /dev/kmsg record whose facility is not the
	// kernel's: a process wrote it to /dev/kmsg, so the driver did not log it.
	// The kernel refuses the kernel facility to writers, so a genuine XID
	// never has this set.
	FromUserspace bool
	// Implied is set for an XID 79 that KmsgScanner inferred from a "GPU has
	// fallen off the bus" message without an Xid line of its own (newer
	// drivers print it over several lines). It is reported once per GPU and
	// not at all when an explicit XID 79 of that GPU came first.
	Implied bool
}

const (
	xidMarker     = "NVRM: Xid"
	uuidMarker    = "NVRM: GPU at PCI:"
	fellOffMarker = "fallen off the bus"
	theGPUMarker  = "NVRM: The NVIDIA GPU "
	fellOffCode   = 79
	maxXIDCode    = 65535
)

// ParseKmsgXID reads one kernel log line carrying an NVIDIA XID report. The
// line may be a /dev/kmsg record ("<prio>,<seq>,<usec>,<flags>;<message>"),
// a dmesg line ("[ 4711.123456] NVRM: Xid …", also with "dmesg -T" or a
// syslog/journal prefix) or the bare message. The message is the driver's
//
//	NVRM: Xid (PCI:<domain>:<bus>:<device>[ GPU-I:<n>[ GPU-CI:<n>]]): <code>[, pid=<pid>][, name=<name>], <text>
//
// where older drivers omit "PCI:", pid or name. ok is false for a line that
// is not an XID report or that cannot be read (bad address, missing code).
func ParseKmsgXID(line string) (XIDEvent, bool) {
	rec := splitRecord(line)
	i := strings.Index(rec.msg, xidMarker)
	if i < 0 {
		return XIDEvent{}, false
	}
	return parseXID(rec, i)
}

// record is one log line split into the /dev/kmsg header fields (when it has
// them) and the message.
type record struct {
	msg       string
	seq       int64
	usec      int64
	userspace bool
}

// splitRecord splits a /dev/kmsg record; any other line is all message.
// Non-printable bytes of a kmsg message, which the kernel escapes as \xHH, are
// unescaped.
func splitRecord(line string) record {
	r := record{msg: line, seq: Unknown, usec: Unknown}
	semi := strings.IndexByte(line, ';')
	if semi <= 0 {
		return r
	}
	// prio,seq,usec,flags[,more fields a later kernel may add]
	fields := strings.Split(line[:semi], ",")
	if len(fields) < 4 {
		return r
	}
	prio, ok1 := parseDecimal(fields[0])
	seq, ok2 := parseDecimal(fields[1])
	usec, ok3 := parseDecimal(fields[2])
	if !ok1 || !ok2 || !ok3 {
		return r
	}
	r.msg, r.seq, r.usec = unescapeKmsg(line[semi+1:]), seq, usec
	r.userspace = prio>>3 != 0 // facility 0 is the kernel's
	return r
}

// parseXID reads the XID report that starts at rec.msg[at:].
func parseXID(rec record, at int) (XIDEvent, bool) {
	ev := XIDEvent{PID: Unknown, GPUInstance: Unknown, ComputeInstance: Unknown,
		Seq: rec.seq, KernelTimeUsec: rec.usec, FromUserspace: rec.userspace}
	if ev.KernelTimeUsec == Unknown {
		ev.KernelTimeUsec = bracketTimestamp(rec.msg[:at])
	}
	s := strings.TrimLeft(rec.msg[at+len(xidMarker):], " ")
	if !strings.HasPrefix(s, "(") {
		return XIDEvent{}, false
	}
	end := strings.IndexByte(s, ')')
	if end < 0 {
		return XIDEvent{}, false
	}
	if !parseAttribution(s[1:end], &ev) {
		return XIDEvent{}, false
	}
	rest, ok := strings.CutPrefix(s[end+1:], ":")
	if !ok {
		return XIDEvent{}, false
	}
	rest = strings.TrimLeft(rest, " ")
	n := 0
	for n < len(rest) && isDigit(rest[n]) {
		n++
	}
	if n == 0 || n > 5 {
		return XIDEvent{}, false
	}
	code, _ := strconv.Atoi(rest[:n])
	if code <= 0 || code > maxXIDCode {
		return XIDEvent{}, false
	}
	ev.Code, rest = code, rest[n:]
	switch {
	case rest == "":
	case rest[0] == ',':
		rest = strings.TrimLeft(rest[1:], " ")
	default:
		return XIDEvent{}, false
	}
	if v, r, ok := cutField(rest, "pid="); ok {
		ev.PID, rest = parsePID(v), r
	}
	if v, r, ok := cutField(rest, "name="); ok {
		if v != "<unknown>" {
			ev.ProcessName = v
		}
		rest = r
	}
	ev.Message = strings.TrimSpace(rest)
	return ev, true
}

// parseAttribution reads what is between the parentheses: the address and
// any MIG instance.
func parseAttribution(s string, ev *XIDEvent) bool {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return false
	}
	bus, ok := NormalizePCIBusID(fields[0])
	if !ok {
		return false
	}
	ev.PCIBusID = bus
	for _, f := range fields[1:] {
		var target *int
		var v string
		switch {
		case strings.HasPrefix(f, "GPU-I:"):
			target, v = &ev.GPUInstance, f[len("GPU-I:"):]
		case strings.HasPrefix(f, "GPU-CI:"):
			target, v = &ev.ComputeInstance, f[len("GPU-CI:"):]
		default:
			continue // an attribution a later driver may add
		}
		n, ok := parseDecimal(v)
		if !ok || n > 0xffff {
			return false
		}
		*target = int(n)
	}
	return true
}

// cutField cuts "key=value," off the front of s.
func cutField(s, key string) (value, rest string, ok bool) {
	v, ok := strings.CutPrefix(s, key)
	if !ok {
		return "", s, false
	}
	if i := strings.IndexByte(v, ','); i >= 0 {
		return strings.TrimSpace(v[:i]), strings.TrimLeft(v[i+1:], " "), true
	}
	return strings.TrimSpace(v), "", true
}

// parsePID reads a pid= value; the driver prints '<unknown>' when the XID
// has no channel.
func parsePID(v string) int {
	n, ok := parseDecimal(strings.Trim(v, "'"))
	if !ok || n > 1<<31-1 {
		return Unknown
	}
	return int(n)
}

// parseDecimal reads 1 to 18 decimal digits and nothing else.
func parseDecimal(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// bracketTimestamp finds dmesg's "[ seconds.fraction]" in the text before the
// message and returns it in microseconds, or Unknown. Other bracketed fields
// ("dmesg -T" dates, "[T1234]" caller ids) are passed over.
func bracketTimestamp(prefix string) int64 {
	for {
		open := strings.IndexByte(prefix, '[')
		if open < 0 {
			return Unknown
		}
		length := strings.IndexByte(prefix[open:], ']')
		if length < 0 {
			return Unknown
		}
		if us, ok := parseSeconds(strings.TrimSpace(prefix[open+1 : open+length])); ok {
			return us
		}
		prefix = prefix[open+length+1:]
	}
}

// parseSeconds reads "seconds.fraction" as microseconds.
func parseSeconds(s string) (int64, bool) {
	secs, frac, ok := strings.Cut(s, ".")
	if !ok || len(secs) > 12 || frac == "" || len(frac) > 9 {
		return 0, false
	}
	sec, ok1 := parseDecimal(secs)
	if _, ok2 := parseDecimal(frac); !ok1 || !ok2 {
		return 0, false
	}
	frac = (frac + "000000")[:6]
	us, _ := parseDecimal(frac)
	return sec*1_000_000 + us, true
}

// unescapeKmsg undoes the kernel's \xHH escaping of /dev/kmsg messages.
func unescapeKmsg(s string) string {
	if !strings.Contains(s, `\x`) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] == 'x' && isHexDigit(s[i+2]) && isHexDigit(s[i+3]) {
			v, _ := strconv.ParseUint(s[i+2:i+4], 16, 8)
			b.WriteByte(byte(v))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// parseGPUUUID reads the driver's "NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>".
func parseGPUUUID(msg string) (bus, uuid string, ok bool) {
	i := strings.Index(msg, uuidMarker)
	if i < 0 {
		return "", "", false
	}
	addr, rest, found := strings.Cut(msg[i+len("NVRM: GPU at "):], ": ")
	if !found {
		return "", "", false
	}
	if bus, ok = NormalizePCIBusID(addr); !ok {
		return "", "", false
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 || !strings.HasPrefix(fields[0], "GPU-") || len(fields[0]) < 8 {
		return "", "", false
	}
	return bus, fields[0], true
}

// gpuAddressAfter returns the address that follows one of the driver's
// "NVRM: GPU …" prefixes in msg.
func gpuAddressAfter(msg string, prefixes ...string) (string, bool) {
	for _, p := range prefixes {
		i := strings.Index(msg, p)
		if i < 0 {
			continue
		}
		fields := strings.Fields(msg[i+len(p):])
		if len(fields) == 0 {
			continue
		}
		if bus, ok := NormalizePCIBusID(strings.TrimSuffix(fields[0], ":")); ok {
			return bus, true
		}
	}
	return "", false
}

// KmsgStats counts what a KmsgScanner read.
type KmsgStats struct {
	// Lines is the number of lines (kmsg records) read.
	Lines int
	// XIDLines is the number of lines that carry an "NVRM: Xid" report.
	XIDLines int
	// Unparseable is the number of XID lines that could not be read; they
	// are skipped.
	Unparseable int
	// Events is the number of events returned, implied ones included.
	Events int
	// TooLong is the number of lines longer than MaxLineBytes, skipped.
	TooLong int
	// Overwritten is how often /dev/kmsg reported (EPIPE) that records were
	// overwritten in the kernel's ring buffer before they were read.
	Overwritten int
}

// MaxLineBytes is the longest line a scanner keeps; a longer one is counted
// (TooLong) and skipped. A /dev/kmsg record is at most 8 KiB.
const MaxLineBytes = 16 << 10

// KmsgScanner reads XID events from a kernel log: /dev/kmsg, or a dmesg,
// journal or syslog text. It reads one line at a time, never fails on a line
// it cannot read (it counts it), and keeps the state that spans lines: the
// GPU UUIDs the driver printed and the several-line "fallen off the bus"
// message. It is meant to stay open on /dev/kmsg for the life of the agent:
// every read it makes offers at least 16 KiB, as /dev/kmsg needs room for a
// whole record, and an EPIPE (records lost while the reader was behind) is
// counted and reading goes on. Open /dev/kmsg for blocking reads (with
// O_NONBLOCK the end of the buffer is an EAGAIN error, which ends the scan).
// The first read after opening /dev/kmsg returns the oldest record still in
// the kernel's buffer, so a restarted agent sees XIDs it has handled before:
// Seq, with the boot ID, tells them apart.
type KmsgScanner struct {
	lines       lineReader
	stats       KmsgStats
	uuids       map[string]string
	lost        map[string]bool
	pending     string // address of a "The NVIDIA GPU <addr>" line
	pendingUsec int64  // and its timestamp
	ttl         int    // lines for which pending is still current
}

// maxTrackedGPUs bounds the scanner's per-GPU memory against a log that
// names endless bogus addresses.
const maxTrackedGPUs = 256

// NewKmsgScanner returns a scanner reading r.
func NewKmsgScanner(r io.Reader) *KmsgScanner {
	return &KmsgScanner{lines: lineReader{r: r, buf: make([]byte, 2*MaxLineBytes)},
		uuids: map[string]string{}, lost: map[string]bool{}}
}

// Next returns the next XID event; ok is false at the end of the input or on
// a read error (see Err).
func (s *KmsgScanner) Next() (XIDEvent, bool) {
	for {
		raw, ok := s.lines.next()
		s.stats.TooLong, s.stats.Overwritten = s.lines.tooLong, s.lines.overwritten
		if !ok {
			return XIDEvent{}, false
		}
		s.stats.Lines++
		if ev, ok := s.line(string(raw)); ok {
			s.stats.Events++
			return ev, true
		}
	}
}

// line handles one line and returns the event it carries, if any.
func (s *KmsgScanner) line(line string) (XIDEvent, bool) {
	rec := splitRecord(line)
	msg := rec.msg
	if i := strings.Index(msg, xidMarker); i >= 0 {
		s.stats.XIDLines++
		ev, ok := parseXID(rec, i)
		if !ok {
			s.stats.Unparseable++
			return XIDEvent{}, false
		}
		ev.UUID = s.uuids[ev.PCIBusID]
		if ev.Code == fellOffCode && !ev.FromUserspace {
			s.markLost(ev.PCIBusID)
		}
		return ev, true
	}
	if bus, uuid, ok := parseGPUUUID(msg); ok {
		if _, known := s.uuids[bus]; known || len(s.uuids) < maxTrackedGPUs {
			s.uuids[bus] = uuid
		}
		return XIDEvent{}, false
	}
	if strings.Contains(msg, fellOffMarker) {
		bus, ok := gpuAddressAfter(msg, "NVRM: GPU at ", "NVRM: GPU ", theGPUMarker)
		usec := rec.usec
		if usec == Unknown {
			usec = bracketTimestamp(msg)
		}
		if !ok && s.ttl > 0 {
			bus, ok = s.pending, true
			if usec == Unknown {
				usec = s.pendingUsec
			}
		}
		s.ttl = 0
		if !ok || s.lost[bus] || rec.userspace {
			return XIDEvent{}, false
		}
		s.markLost(bus)
		ev := XIDEvent{PCIBusID: bus, UUID: s.uuids[bus], Code: fellOffCode, PID: Unknown,
			GPUInstance: Unknown, ComputeInstance: Unknown, Seq: rec.seq, KernelTimeUsec: usec, Implied: true}
		ev.Message = strings.TrimSpace(msg[max(0, strings.Index(msg, "NVRM: ")):])
		return ev, true
	}
	if bus, ok := gpuAddressAfter(msg, theGPUMarker); ok {
		s.pending, s.ttl = bus, 3
		if s.pendingUsec = rec.usec; s.pendingUsec == Unknown {
			s.pendingUsec = bracketTimestamp(msg)
		}
		return XIDEvent{}, false
	}
	if s.ttl > 0 {
		s.ttl--
	}
	return XIDEvent{}, false
}

func (s *KmsgScanner) markLost(bus string) {
	if s.lost[bus] || len(s.lost) < maxTrackedGPUs {
		s.lost[bus] = true
	}
}

// Stats returns the counts so far.
func (s *KmsgScanner) Stats() KmsgStats { return s.stats }

// Err returns the read error that ended the scan; nil at the end of input.
func (s *KmsgScanner) Err() error {
	if errors.Is(s.lines.err, io.EOF) {
		return nil
	}
	return s.lines.err
}

// ScanKmsg reads all of r and returns its XID events.
func ScanKmsg(r io.Reader) ([]XIDEvent, KmsgStats, error) {
	s := NewKmsgScanner(r)
	var events []XIDEvent
	for {
		ev, ok := s.Next()
		if !ok {
			break
		}
		events = append(events, ev)
	}
	return events, s.Stats(), s.Err()
}

// lineReader splits a reader into lines without bufio.Scanner's limits: a line
// longer than the buffer is skipped (counted) rather than ending the scan, a
// read always offers at least half the buffer (a /dev/kmsg read fails with
// EINVAL if the next record does not fit), and EPIPE is not fatal.
type lineReader struct {
	r           io.Reader
	buf         []byte
	start, end  int
	discarding  bool // dropping the rest of a too-long line
	err         error
	empty       int // consecutive reads that returned nothing
	tooLong     int
	overwritten int
}

const maxEmptyReads = 100

func (l *lineReader) next() ([]byte, bool) {
	for {
		if i := bytes.IndexByte(l.buf[l.start:l.end], '\n'); i >= 0 {
			line := l.buf[l.start : l.start+i]
			l.start += i + 1
			if l.discarding {
				l.discarding = false
				continue
			}
			return bytes.TrimSuffix(line, []byte("\r")), true
		}
		if l.end-l.start > MaxLineBytes {
			if !l.discarding {
				l.tooLong++
			}
			l.discarding = true
			l.start, l.end = 0, 0
		}
		if l.err != nil {
			if l.start < l.end && !l.discarding {
				line := l.buf[l.start:l.end]
				l.start = l.end
				return line, true
			}
			return nil, false
		}
		if l.start > 0 {
			l.end = copy(l.buf, l.buf[l.start:l.end])
			l.start = 0
		}
		n, err := l.r.Read(l.buf[l.end:])
		if n < 0 || n > len(l.buf)-l.end {
			l.err = errors.New("reader returned an invalid count")
			continue
		}
		l.end += n
		if n > 0 {
			l.empty = 0
		} else if l.empty++; l.empty >= maxEmptyReads {
			l.err = io.ErrNoProgress // also ends a reader that answers EPIPE forever
			continue
		}
		switch {
		case errors.Is(err, syscall.EPIPE):
			l.overwritten++
		case err != nil:
			l.err = err
		}
	}
}
