package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	tests := map[string]struct {
		args      []string
		wantPID   int
		wantEnter []namespace
		wantArgv  []string
		wantErr   bool
	}{
		"the agent's command line": {
			args:    []string{"--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--", "systemctl", "restart", "kubelet"},
			wantPID: 1, wantEnter: []namespace{ipcNS, utsNS, netNS, pidNS, mountNS}, wantArgv: []string{"systemctl", "restart", "kubelet"},
		},
		"short options, program without --": {
			args:    []string{"-t", "42", "-m", "crictl", "pods", "-o", "json"},
			wantPID: 42, wantEnter: []namespace{mountNS}, wantArgv: []string{"crictl", "pods", "-o", "json"},
		},
		"--target=PID": {
			args:    []string{"--target=7", "-n", "--", "ip", "-br", "a"},
			wantPID: 7, wantEnter: []namespace{netNS}, wantArgv: []string{"ip", "-br", "a"},
		},
		"the program's options are not nsenter's": {
			args:    []string{"-t", "1", "-m", "--", "ls", "-m"},
			wantPID: 1, wantEnter: []namespace{mountNS}, wantArgv: []string{"ls", "-m"},
		},
		"no target":             {args: []string{"-m", "--", "true"}, wantErr: true},
		"target without PID":    {args: []string{"-m", "--target"}, wantErr: true},
		"bad PID":               {args: []string{"-t", "one", "-m", "--", "true"}, wantErr: true},
		"zero PID":              {args: []string{"-t", "0", "-m", "--", "true"}, wantErr: true},
		"no namespace":          {args: []string{"-t", "1", "--", "true"}, wantErr: true},
		"no program":            {args: []string{"-t", "1", "-m", "--"}, wantErr: true},
		"unsupported namespace": {args: []string{"-t", "1", "--user", "--", "true"}, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req, err := parse(tc.args)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("parse(%q) = %+v, want an error", tc.args, req)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var enter []namespace
			for _, ns := range order {
				if req.enter[ns] {
					enter = append(enter, ns)
				}
			}
			if diff := cmp.Diff(tc.wantEnter, enter, cmp.AllowUnexported(namespace{})); diff != "" || req.target != tc.wantPID {
				t.Errorf("target %d (want %d), namespaces (-want +got):\n%s", req.target, tc.wantPID, diff)
			}
			if diff := cmp.Diff(tc.wantArgv, req.argv); diff != "" {
				t.Errorf("argv (-want +got):\n%s", diff)
			}
		})
	}
}
