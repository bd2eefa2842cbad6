// Package gpufault detects GPU faults on a node. It reads the two places a
// node reports them: the kernel log, where the NVIDIA driver prints an XID
// for every fault it sees (ParseKmsgXID, KmsgScanner on /dev/kmsg), and the
// Prometheus metrics of dcgm-exporter, which the GPU stack deploys on every
// GPU node (ParseDCGMMetrics for XIDs, ECC errors, row remapping, retired
// pages and NVLink errors per GPU; Assess for the faults they amount to,
// including a GPU missing from the node's nvidia.com/gpu capacity).
//
// Every fault has a Class: Informational and Application faults are recorded
// and not repaired, ResetGPU, Reboot and Replace say what the repair is. The
// class of an XID comes from a catalogue kept as data (catalogue.go), which
// follows the resolution buckets ("immediate action", "investigatory
// action") of NVIDIA's XID catalogue for Ampere and newer GPUs, "Analyzing
// Xid Errors with the Xid Catalog" in NVIDIA's "XID Errors" document
// (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html),
// with NVIDIA's "GPU Memory Error Management" guide for row remapping; each
// entry cites its sources and notes where the class is a judgement rather
// than a translation. A policy can override the class of any code.
//
// Everything here is pure: parsers over an io.Reader or a string and
// functions over their results, no clock, no client, no files. A line or
// metric they cannot read is counted and skipped. The node agent does the
// reading (/dev/kmsg, the exporter's endpoint) and acts on the faults.
package gpufault
