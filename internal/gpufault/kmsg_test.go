package gpufault

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// xid is an event with nothing but the given fields known.
func xid(bus string, code int, mut func(*XIDEvent)) XIDEvent {
	ev := XIDEvent{PCIBusID: bus, Code: code, PID: Unknown, GPUInstance: Unknown, ComputeInstance: Unknown,
		Seq: Unknown, KernelTimeUsec: Unknown}
	if mut != nil {
		mut(&ev)
	}
	return ev
}

func TestParseKmsgXID(t *testing.T) {
	tests := map[string]struct {
		line   string
		want   XIDEvent
		wantOK bool
	}{
		"kmsg record, pid and name": {
			line: `4,20015,183746001355,-;NVRM: Xid (PCI:0000:1b:00): 13, pid=48211, name=python3, Graphics SM Warp Exception on (GPC 2, TPC 4, SM 1): Out Of Range Address`,
			want: xid("0000:1b:00.0", 13, func(e *XIDEvent) {
				e.PID, e.ProcessName, e.Seq, e.KernelTimeUsec = 48211, "python3", 20015, 183746001355
				e.Message = "Graphics SM Warp Exception on (GPC 2, TPC 4, SM 1): Out Of Range Address"
			}),
			wantOK: true,
		},
		"newer driver without a channel: pid and name unknown": {
			line: `4,20312,201110220160,-;NVRM: Xid (PCI:0000:43:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row (0x00000000000a3f20) marked for remapping, reset gpu to activate.`,
			want: xid("0000:43:00.0", 63, func(e *XIDEvent) {
				e.Seq, e.KernelTimeUsec = 20312, 201110220160
				e.Message = "Row Remapper: New row (0x00000000000a3f20) marked for remapping, reset gpu to activate."
			}),
			wantOK: true,
		},
		"no pid or name (XID 154)": {
			line: `4,20314,201110230002,-;NVRM: Xid (PCI:0000:43:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)`,
			want: xid("0000:43:00.0", 154, func(e *XIDEvent) {
				e.Seq, e.KernelTimeUsec = 20314, 201110230002
				e.Message = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
			}),
			wantOK: true,
		},
		"older driver: pid without name, dmesg timestamp after a syslog prefix": {
			line: `Oct 15 12:40:10 gpu-node-7 kernel: [ 8812.000401] NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.`,
			want: xid("0000:10:1c.0", 63, func(e *XIDEvent) {
				e.PID, e.KernelTimeUsec = 1896, 8812000401
				e.Message = "Row Remapper: New row marked for remapping, reset gpu to activate."
			}),
			wantOK: true,
		},
		"oldest driver: no PCI: prefix, no pid": {
			line: `[  966.503025] NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 00000120, intr 10000000`,
			want: xid("0000:01:00.0", 31, func(e *XIDEvent) {
				e.KernelTimeUsec = 966503025
				e.Message = "Ch 0000000b, engmask 00000120, intr 10000000"
			}),
			wantOK: true,
		},
		"dmesg -T: the date is not a timestamp": {
			line: `[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005`,
			want: xid("0000:cb:00.0", 109, func(e *XIDEvent) {
				e.PID, e.ProcessName = 1797828, "pt_main_thread"
				e.Message = "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"
			}),
			wantOK: true,
		},
		"caller id before the timestamp": {
			line: `[T4211] [ 12.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.`,
			want: xid("0000:3b:00.0", 79, func(e *XIDEvent) {
				e.PID, e.KernelTimeUsec, e.Message = 0, 12500000, "GPU has fallen off the bus."
			}),
			wantOK: true,
		},
		"MIG: GPU and compute instance": {
			line: `4,20601,240000000001,-;NVRM: Xid (PCI:0000:c3:00 GPU-I:03 GPU-CI:00): 31, pid=60001, name=vllm, channel 0x00000009`,
			want: xid("0000:c3:00.0", 31, func(e *XIDEvent) {
				e.GPUInstance, e.ComputeInstance, e.PID, e.ProcessName = 3, 0, 60001, "vllm"
				e.Seq, e.KernelTimeUsec, e.Message = 20601, 240000000001, "channel 0x00000009"
			}),
			wantOK: true,
		},
		"MIG: GPU instance only": {
			line: `NVRM: Xid (PCI:0000:c3:00 GPU-I:07): 43, pid=1, name=x, Ch 00000002`,
			want: xid("0000:c3:00.0", 43, func(e *XIDEvent) {
				e.GPUInstance, e.PID, e.ProcessName, e.Message = 7, 1, "x", "Ch 00000002"
			}),
			wantOK: true,
		},
		"address with a function (accepted, though the driver prints none)": {
			line:   `NVRM: Xid (PCI:0000:3B:00.0): 45, pid=7781, name=torchrun, Ch 00000010`,
			want:   xid("0000:3b:00.0", 45, func(e *XIDEvent) { e.PID, e.ProcessName, e.Message = 7781, "torchrun", "Ch 00000010" }),
			wantOK: true,
		},
		"NVLink 5 report, non-zero domain": {
			line: `4,20800,260000000003,-;NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000)`,
			want: xid("0018:01:00.0", 149, func(e *XIDEvent) {
				e.Seq, e.KernelTimeUsec, e.Message = 20800, 260000000003, "NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000)"
			}),
			wantOK: true,
		},
		"written to /dev/kmsg by a process": {
			line: `12,20900,270000000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=1, name=echo, GPU has fallen off the bus.`,
			want: xid("0000:1b:00.0", 79, func(e *XIDEvent) {
				e.PID, e.ProcessName, e.Seq, e.KernelTimeUsec, e.FromUserspace = 1, "echo", 20900, 270000000000, true
				e.Message = "GPU has fallen off the bus."
			}),
			wantOK: true,
		},
		"kmsg escapes and header fields a later kernel may add": {
			line: `4,7,8,-,caller=T12;NVRM: Xid (PCI:0000:1b:00): 13, pid=2, name=a\x5cb, Graphics Exception\x0a`,
			want: xid("0000:1b:00.0", 13, func(e *XIDEvent) {
				e.PID, e.ProcessName, e.Seq, e.KernelTimeUsec, e.Message = 2, `a\b`, 7, 8, "Graphics Exception"
			}),
			wantOK: true,
		},
		"code at the end of the line": {
			line:   `NVRM: Xid (PCI:0000:1b:00): 79`,
			want:   xid("0000:1b:00.0", 79, nil),
			wantOK: true,
		},
		"not an XID: the UUID line":  {line: `4,20013,183746001234,-;NVRM: GPU at PCI:0000:1b:00: GPU-6f3a7c1e-2b4d-4e8f-9a01-5c6d7e8f9a0b`},
		"not an XID: other message":  {line: `6,1602,10234567,-;nvidia 0000:1b:00.0: enabling device (0000 -> 0002)`},
		"not an XID: empty":          {line: ``},
		"not an XID: dictionary":     {line: ` DEVICE=+pci:0000:1b:00.0`},
		"unreadable: bad address":    {line: `NVRM: Xid (PCI:zzzz:1b:00): 48, garbled address`},
		"unreadable: bus too large":  {line: `NVRM: Xid (PCI:0000:1b0:00): 48, x`},
		"unreadable: missing code":   {line: `NVRM: Xid (PCI:0000:1b:00): , missing code`},
		"unreadable: code zero":      {line: `NVRM: Xid (PCI:0000:1b:00): 0, x`},
		"unreadable: code too long":  {line: `NVRM: Xid (PCI:0000:1b:00): 123456, x`},
		"unreadable: code and text":  {line: `NVRM: Xid (PCI:0000:1b:00): 79x, x`},
		"unreadable: no parenthesis": {line: `NVRM: Xid PCI:0000:1b:00: 79, x`},
		"unreadable: unterminated":   {line: `NVRM: Xid (PCI:0000:1b:00: 79, x`},
		"unreadable: bad MIG id":     {line: `NVRM: Xid (PCI:0000:1b:00 GPU-I:x): 79, x`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := ParseKmsgXID(tc.line)
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v (event %+v)", ok, tc.wantOK, got)
			}
			if !ok {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("event (-want +got):\n%s", diff)
			}
		})
	}
}

// summary writes an event on one line for the sample tables.
func summary(e XIDEvent) string {
	s := fmt.Sprintf("%s %d", e.PCIBusID, e.Code)
	if e.PID != Unknown {
		s += fmt.Sprintf(" pid=%d", e.PID)
	}
	if e.ProcessName != "" {
		s += " name=" + e.ProcessName
	}
	if e.GPUInstance != Unknown || e.ComputeInstance != Unknown {
		s += fmt.Sprintf(" mig=%d/%d", e.GPUInstance, e.ComputeInstance)
	}
	if e.Seq != Unknown {
		s += fmt.Sprintf(" seq=%d", e.Seq)
	}
	if e.KernelTimeUsec != Unknown {
		s += fmt.Sprintf(" t=%d", e.KernelTimeUsec)
	}
	if e.UUID != "" {
		s += " " + e.UUID
	}
	if e.FromUserspace {
		s += " userspace"
	}
	if e.Implied {
		s += " implied"
	}
	return s
}

func TestScanKmsgSamples(t *testing.T) {
	tests := map[string]struct {
		file      string
		want      []string
		wantStats KmsgStats
	}{
		"/dev/kmsg of an HGX H100 node": {
			file: "kmsg-hgx-h100.txt",
			want: []string{
				"0000:1b:00.0 13 pid=48211 name=python3 seq=20015 t=183746001355 GPU-6f3a7c1e-2b4d-4e8f-9a01-5c6d7e8f9a0b",
				"0000:1b:00.0 13 pid=48211 name=python3 seq=20016 t=183746001390 GPU-6f3a7c1e-2b4d-4e8f-9a01-5c6d7e8f9a0b",
				"0000:1b:00.0 43 pid=48211 name=python3 seq=20017 t=183746101502 GPU-6f3a7c1e-2b4d-4e8f-9a01-5c6d7e8f9a0b",
				"0000:43:00.0 48 pid=51022 name=pt_main_thread seq=20311 t=201110220093 GPU-0b9d4e21-77aa-4c3b-8e5f-112233445566",
				"0000:43:00.0 63 seq=20312 t=201110220160 GPU-0b9d4e21-77aa-4c3b-8e5f-112233445566",
				"0000:43:00.0 94 pid=51022 name=pt_main_thread seq=20313 t=201110220171 GPU-0b9d4e21-77aa-4c3b-8e5f-112233445566",
				"0000:43:00.0 154 seq=20314 t=201110230002 GPU-0b9d4e21-77aa-4c3b-8e5f-112233445566",
				"0000:9a:00.0 79 seq=20501 t=233001004455", // the "GPU … has fallen off the bus" after it adds nothing
				"0000:c3:00.0 31 pid=60001 name=vllm mig=3/0 seq=20601 t=240000000001",
				"0000:c3:00.0 119 pid=2231 name=nvidia-smi seq=20700 t=250000000002",
				"0018:01:00.0 149 seq=20800 t=260000000003",
				"0018:01:00.0 144 seq=20801 t=260000000004",
				"0000:18:00.0 79 seq=20852 t=265000000002 implied", // three records, no Xid line
				"0000:1b:00.0 79 pid=1 name=echo seq=20900 t=270000000000 GPU-6f3a7c1e-2b4d-4e8f-9a01-5c6d7e8f9a0b userspace",
			},
			wantStats: KmsgStats{Lines: 28, XIDLines: 15, Unparseable: 2, Events: 14},
		},
		"dmesg, dmesg -T and journal lines": {
			file: "dmesg.txt",
			want: []string{
				"0000:01:00.0 31 t=966503025",
				"0000:cb:00.0 13",
				"0000:cb:00.0 109 pid=1797828 name=pt_main_thread",
				"0000:10:00.0 79 pid=0 GPU-072931a9-3c93-2239-0583-43798217258d",
				"0000:10:1c.0 63 pid=1896 t=8812000401",
				"0000:01:00.0 79 t=1936510073 implied", // once, though printed twice
				"0000:18:00.0 79 t=5123000001 implied", // over three lines
				"0000:3b:00.0 45 pid=7781 name=torchrun t=6000000000",
			},
			wantStats: KmsgStats{Lines: 14, XIDLines: 6, Events: 8},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			events, stats, err := ScanKmsg(bytes.NewReader(readSample(t, tc.file)))
			if err != nil {
				t.Fatalf("ScanKmsg: %v", err)
			}
			var got []string
			for _, e := range events {
				got = append(got, summary(e))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantStats, stats); diff != "" {
				t.Errorf("stats (-want +got):\n%s", diff)
			}
		})
	}
}

// kmsgDevice behaves as /dev/kmsg does: each read returns one whole record,
// fails with EINVAL if the buffer cannot hold it, and can fail with EPIPE
// when records were overwritten.
type kmsgDevice struct {
	reads []any // string record or error
}

func (d *kmsgDevice) Read(p []byte) (int, error) {
	if len(d.reads) == 0 {
		return 0, io.EOF
	}
	next := d.reads[0]
	if err, ok := next.(error); ok {
		d.reads = d.reads[1:]
		return 0, err
	}
	rec := next.(string)
	if len(p) < len(rec) {
		return 0, syscall.EINVAL
	}
	d.reads = d.reads[1:]
	return copy(p, rec), nil
}

func TestKmsgScannerReading(t *testing.T) {
	const x13 = "4,1,100,-;NVRM: Xid (PCI:0000:1b:00): 13, pid=1, name=a, x\n"
	const x48 = "4,5,500,-;NVRM: Xid (PCI:0000:1b:00): 48, pid=1, name=a, x\n"
	long := "6,2,200,-;" + strings.Repeat("y", 8000) + "\n" // a near-maximal record
	errBoom := errors.New("boom")
	tests := map[string]struct {
		r         io.Reader
		want      []string
		wantStats KmsgStats
		wantErr   error
	}{
		"records, big ones and an overwrite (EPIPE)": {
			r:         &kmsgDevice{reads: []any{x13, long, long, long, &os.PathError{Op: "read", Path: "/dev/kmsg", Err: syscall.EPIPE}, x48}},
			want:      []string{"0000:1b:00.0 13 pid=1 name=a seq=1 t=100", "0000:1b:00.0 48 pid=1 name=a seq=5 t=500"},
			wantStats: KmsgStats{Lines: 5, XIDLines: 2, Events: 2, Overwritten: 1},
		},
		"a several-line message in one record (newlines escaped)": {
			r:         &kmsgDevice{reads: []any{`6,9,900,-;NVRM: The NVIDIA GPU 0000:18:00.0\x0aNVRM: (PCI ID: 10de:2330) installed in this system has\x0aNVRM: fallen off the bus and is not responding to commands.` + "\n"}},
			want:      []string{"0000:18:00.0 79 seq=9 t=900 implied"},
			wantStats: KmsgStats{Lines: 1, Events: 1},
		},
		"a line longer than MaxLineBytes is skipped": {
			r:         strings.NewReader(strings.Repeat("z", 3*MaxLineBytes) + "\n" + x48),
			want:      []string{"0000:1b:00.0 48 pid=1 name=a seq=5 t=500"},
			wantStats: KmsgStats{Lines: 1, XIDLines: 1, Events: 1, TooLong: 1},
		},
		"last line without a newline, CRLF": {
			r:         strings.NewReader("NVRM: Xid (PCI:0000:1b:00): 31, a\r\nNVRM: Xid (PCI:0000:1b:00): 13, b"),
			want:      []string{"0000:1b:00.0 31", "0000:1b:00.0 13"},
			wantStats: KmsgStats{Lines: 2, XIDLines: 2, Events: 2},
		},
		"a read error ends the scan, after what was read": {
			r:         io.MultiReader(strings.NewReader(x13), iotestErr{errBoom}),
			want:      []string{"0000:1b:00.0 13 pid=1 name=a seq=1 t=100"},
			wantStats: KmsgStats{Lines: 1, XIDLines: 1, Events: 1},
			wantErr:   errBoom,
		},
		"a reader that never answers ends with ErrNoProgress": {
			r:         &kmsgDevice{reads: repeat[any](syscall.EPIPE, 1000)},
			wantStats: KmsgStats{Overwritten: maxEmptyReads - 1},
			wantErr:   io.ErrNoProgress,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			events, stats, err := ScanKmsg(tc.r)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			var got []string
			for _, e := range events {
				got = append(got, summary(e))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantStats, stats); diff != "" {
				t.Errorf("stats (-want +got):\n%s", diff)
			}
		})
	}
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

func repeat[T any](v T, n int) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// checkEvent holds for every event a parser returns.
func checkEvent(t *testing.T, e XIDEvent) {
	t.Helper()
	if e.Code <= 0 || e.Code > maxXIDCode {
		t.Fatalf("code %d out of range: %+v", e.Code, e)
	}
	if norm, ok := NormalizePCIBusID(e.PCIBusID); !ok || norm != e.PCIBusID {
		t.Fatalf("address %q not normalised (%q, %v)", e.PCIBusID, norm, ok)
	}
	if e.PID < Unknown || e.GPUInstance < Unknown || e.ComputeInstance < Unknown || e.Seq < Unknown || e.KernelTimeUsec < Unknown {
		t.Fatalf("negative number: %+v", e)
	}
	if e.Message != strings.TrimSpace(e.Message) {
		t.Fatalf("message not trimmed: %q", e.Message)
	}
}

// sampleLines returns the lines of the kernel-log samples, for fuzz seeds.
func sampleLines(t testing.TB) []string {
	var lines []string
	for _, f := range []string{"kmsg-hgx-h100.txt", "dmesg.txt"} {
		data, err := os.ReadFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, strings.Split(string(data), "\n")...)
	}
	return lines
}

func FuzzParseKmsgXID(f *testing.F) {
	for _, l := range sampleLines(f) {
		f.Add(l)
	}
	f.Fuzz(func(t *testing.T, line string) {
		e, ok := ParseKmsgXID(line)
		if !ok {
			return
		}
		checkEvent(t, e)
		if e.UUID != "" || e.Implied {
			t.Fatalf("a single line cannot give a UUID or an implied event: %+v", e)
		}
	})
}

func FuzzScanKmsg(f *testing.F) {
	for _, name := range []string{"kmsg-hgx-h100.txt", "dmesg.txt"} {
		f.Add(readSample(f, name))
	}
	lines := sampleLines(f)
	for i := 0; i+3 <= len(lines); i += 3 {
		f.Add([]byte(strings.Join(lines[i:i+3], "\n")))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		events, st, err := ScanKmsg(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("ScanKmsg of a byte slice: %v", err)
		}
		if st.Unparseable > st.XIDLines || st.XIDLines > st.Lines || st.Events > st.Lines || st.Events != len(events) {
			t.Fatalf("inconsistent stats %+v for %d events", st, len(events))
		}
		for _, e := range events {
			checkEvent(t, e)
		}
	})
}
