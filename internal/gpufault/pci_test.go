package gpufault

import "testing"

func TestNormalizePCIBusID(t *testing.T) {
	tests := map[string]struct {
		in     string
		want   string
		wantOK bool
	}{
		"kernel log":           {in: "0000:3b:00", want: "0000:3b:00.0", wantOK: true},
		"kernel log, PCI:":     {in: "PCI:0000:3B:00", want: "0000:3b:00.0", wantOK: true},
		"NVML and DCGM":        {in: "00000000:3B:00.0", want: "0000:3b:00.0", wantOK: true},
		"sysfs":                {in: "0000:3b:00.0", want: "0000:3b:00.0", wantOK: true},
		"oldest drivers":       {in: "01:00", want: "0000:01:00.0", wantOK: true},
		"domain above 0xffff":  {in: "10000:e0:00.0", want: "10000:e0:00.0", wantOK: true},
		"GB200 domain":         {in: "PCI:0018:01:00", want: "0018:01:00.0", wantOK: true},
		"function 7":           {in: "0000:3b:1f.7", want: "0000:3b:1f.7", wantOK: true},
		"device above 0x1f":    {in: "0000:3b:20.0"},
		"function above 7":     {in: "0000:3b:00.8"},
		"bus above 0xff":       {in: "0000:100:00.0"},
		"not hex":              {in: "0000:3g:00.0"},
		"empty":                {in: ""},
		"one part":             {in: "3b"},
		"four parts":           {in: "0:0:3b:00"},
		"domain too long":      {in: "000000000:3b:00.0"},
		"empty function":       {in: "0000:3b:00."},
		"sign":                 {in: "+000:3b:00.0"},
		"surrounding spaces":   {in: " 0000:3b:00 ", want: "0000:3b:00.0", wantOK: true},
		"lower-case pci: kept": {in: "pci:0000:3b:00", want: "0000:3b:00.0", wantOK: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := NormalizePCIBusID(tc.in)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("NormalizePCIBusID(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func FuzzNormalizePCIBusID(f *testing.F) {
	for _, s := range []string{"0000:3b:00", "PCI:0000:3b:00", "00000000:3B:00.0", "01:00", "0018:01:00.7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := NormalizePCIBusID(s)
		if !ok {
			return
		}
		again, ok2 := NormalizePCIBusID(got)
		if !ok2 || again != got {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", s, got, again, ok2)
		}
	})
}
