package gpufault

import "strings"

// The catalogue of XID codes, as data. Codes, mnemonics and resolution
// buckets are those of NVIDIA's XID catalogue for Ampere and newer GPUs
// (citeCatalogue); codes the catalogue marks "Unused" are left out and fall
// to Classify's unknown-code class. The meanings are gpufleet's words.
//
// The class follows NVIDIA's immediate action:
//
//	RESTART_APP                    → Application
//	IGNORE                         → Informational, except 37 (investigate the
//	                                 application) and 43 (a channel stopped
//	                                 after an application fault), Application
//	RESET_GPU                      → ResetGPU, except 64: Replace (a failed
//	                                 row remap is an RMA condition)
//	RESTART_BM, RESTART_VM         → Reboot
//	CHECK_MECHANICALS              → Replace
//	WORKFLOW_XID_45 / _48 / NVLINK → Application / ResetGPU / ResetGPU
//	XID_154                        → Informational by code; ClassifyEvent
//	                                 reads the action in the message
//
// and, where the catalogue names no automatic action (UPDATE_SWFW,
// CHECK_UVM, CONTACT_SUPPORT as the immediate action, or no bucket at all for
// the newest codes), the entry's Note says which class was chosen and why;
// when in doubt it is the class that restores more.
const (
	citeCatalogue = `NVIDIA, "XID Errors", section "Analyzing Xid Errors with the Xid Catalog" ` +
		`(Ampere and newer; Resolution Bucket columns), https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html`
	citeMemory = `NVIDIA, "GPU Memory Error Management", section "Error Recovery and Response Flags" ` +
		`(row-remapping pending and failure flags, recovery action flag), ` +
		`https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html`
	citeRecoveryAction = `NVIDIA NVML API reference, nvmlDeviceGpuRecoveryAction_t`
	citeDevicePlugin   = `NVIDIA k8s-device-plugin, internal/rm/health.go (XIDs it skips by default as application errors)`
	citeNVLinkChecks   = `NVIDIA Health Validation, "NVLink Checks" (recommended action: drain, then reset_gpu, restart_os, ` +
		`service_required), https://docs.nvidia.com/health-validation/reference/checks/nvlink`
	citePageRetirement = `NVIDIA, "Dynamic Page Retirement", section "Visibility", ` +
		`https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html`
)

const (
	noBucket     = "The catalogue gives no resolution bucket for this code yet; "
	nvlink5Note  = "NVIDIA's NVLink 5 decode table resets the GPU for fatal reports and ignores most non-fatal ones; by code alone the fatal case is assumed (ClassifyEvent reads Fatal/Nonfatal from the message)"
	copyEngine   = "Copy engine exception; the affected contexts are stopped"
	videoDecoder = "Video decoder exception; the affected contexts are stopped"
	jpegDecoder  = "JPEG decoder exception; the affected contexts are stopped"
)

// row builds a catalogue entry citing NVIDIA's XID catalogue and any further
// documents.
func row(code int, mnemonic, meaning string, class Class, immediate, investigatory, note string, cites ...string) Entry {
	return Entry{Code: code, Mnemonic: mnemonic, Meaning: meaning, Class: class,
		Immediate: immediate, Investigatory: investigatory, Note: note,
		Citation: strings.Join(append([]string{citeCatalogue}, cites...), "; ")}
}

var catalogue = []Entry{
	row(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "A channel stopped making progress (GPU stopped processing for it); its context is torn down", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Invalid or corrupted command (push buffer) stream sent to the graphics engine", ClassApplication, "RESTART_APP", "CHECK_APP/CUDA", ""),
	row(13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics/compute engine exception, typically an illegal instruction or out-of-range address in a kernel", ClassApplication, "RESTART_APP", "WORKFLOW_XID_13", "", citeDevicePlugin),
	row(25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Illegal command (push buffer) stream", ClassApplication, "RESTART_APP", "CHECK_APP/CUDA", ""),
	row(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault: a context used an address it has not mapped, usually an application bug", ClassApplication, "RESTART_APP", "WORKFLOW_XID_31", "", citeDevicePlugin),
	row(32, "ROBUST_CHANNEL_PBDMA_ERROR", "Push-buffer DMA error: corrupted command stream", ClassApplication, "RESTART_APP", "CHECK_APP/CUDA", ""),
	row(37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Context-switch firmware received a method it does not implement", ClassApplication, "IGNORE", "CHECK_APP/CUDA", "No immediate action; the investigation points at the application, so it is the application's class"),
	row(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Context-switch firmware watchdog timeout", ClassInformational, "IGNORE", "CONTACT_SUPPORT", ""),
	row(39, "ROBUST_CHANNEL_CE0_ERROR", copyEngine+" (CE0)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(40, "ROBUST_CHANNEL_CE1_ERROR", copyEngine+" (CE1)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(41, "ROBUST_CHANNEL_CE2_ERROR", copyEngine+" (CE2)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "A channel was stopped after an application fault (GPU stopped processing for that context)", ClassApplication, "IGNORE", "CONTACT_SUPPORT", "No immediate action; the fault is the application's (the NVIDIA device plugin also skips it as an application error)", citeDevicePlugin),
	row(44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics engine fault during a context switch", ClassInformational, "IGNORE", "CONTACT_SUPPORT", ""),
	row(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Channels torn down because of an earlier error (often another XID, e.g. a double-bit ECC error); the earlier error carries the repair", ClassApplication, "WORKFLOW_XID_45", "Solo: RESTART_FM; not solo: IGNORE (follow other Xid)", "NVIDIA's workflow follows the other XID; alone it is a Fabric Manager restart, which gpufleet does not do", citeDevicePlugin),
	row(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "The GPU stopped processing (GPU timeout)", ClassResetGPU, "RESET_GPU", "CONTACT_SUPPORT", ""),
	row(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Uncorrectable (double-bit) ECC error in GPU memory", ClassResetGPU, "WORKFLOW_XID_48", "WORKFLOW_XID_48", "NVIDIA's XID 48 workflow resets the GPU, which activates the row remap the error caused; a failed remap (XID 64) is for replacement", citeMemory),
	row(54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "Auxiliary power is not connected to the board; the GPU runs at reduced clocks", ClassReplace, "CHECK_MECHANICALS", "CONTACT_SUPPORT", "Needs someone at the machine: no reset or reboot connects a power cable"),
	row(60, "ROBUST_CHANNEL_SEC2_ERROR", "Exception in the SEC2 engine (reported as a video processor exception)", ClassApplication, "RESTART_APP", "INVESTIGATE_SW", ""),
	row(62, "PMU_HALT_ERROR", "An internal micro-controller (PMU) halted", ClassResetGPU, "RESET_GPU", "CONTACT_SUPPORT", ""),
	row(63, "INFOROM_DRAM_RETIREMENT_EVENT", "A memory row was marked for remapping (a page retired on older GPUs); it takes effect at the next GPU reset", ClassInformational, "IGNORE", "IGNORE", "Nothing to do now: the remap waits for the next reset and the memory is already avoided", citeMemory),
	row(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "Remapping a memory row (retiring a page on older GPUs) failed", ClassReplace, "RESET_GPU", "CONTACT_SUPPORT", "The immediate bucket is a reset, but a row-remapping failure is one of NVIDIA's RMA conditions; Replace is the safer class (a policy may override it to ResetGPU)", citeMemory),
	row(66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Illegal register access by the driver", ClassInformational, "IGNORE", "INVESTIGATE_SW", ""),
	row(67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Illegal access by the driver (verification violation)", ClassInformational, "IGNORE", "CONTACT_SUPPORT", ""),
	row(68, "ROBUST_CHANNEL_NVDEC0_ERROR", videoDecoder+" (NVDEC0)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", "", citeDevicePlugin),
	row(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics engine class error (a method the class does not accept)", ClassApplication, "RESTART_APP", "CHECK_APP/CUDA", ""),
	row(70, "ROBUST_CHANNEL_CE3_ERROR", copyEngine+" (CE3)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(71, "ROBUST_CHANNEL_CE4_ERROR", copyEngine+" (CE4)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(72, "ROBUST_CHANNEL_CE5_ERROR", copyEngine+" (CE5)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(74, "NVLINK_ERROR", "NVLink error on one of the GPU's links", ClassResetGPU, "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", "NVIDIA's NVLink workflow starts with a GPU reset and escalates to a reboot and then service; the repair ladder does the same", citeNVLinkChecks),
	row(75, "ROBUST_CHANNEL_CE6_ERROR", copyEngine+" (CE6)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(76, "ROBUST_CHANNEL_CE7_ERROR", copyEngine+" (CE7)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(77, "ROBUST_CHANNEL_CE8_ERROR", copyEngine+" (CE8)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(78, "VGPU_START_ERROR", "A vGPU failed to start", ClassReboot, "UPDATE_SWFW", "UPDATE_SWFW", "NVIDIA asks for a software/firmware update, which is not a repair action; a reboot reloads the driver stack (and applies a pending driver upgrade)"),
	row(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "The GPU stopped answering on PCIe (fell off the bus)", ClassReboot, "RESTART_BM", "CONTACT_SUPPORT", "A GPU reset cannot reach a GPU that is off the bus; NVIDIA restarts the host; a GPU that falls off again is for replacement (repeated faults end in RecoveryFailed)"),
	row(80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "A command (push buffer) failed its CRC check: corrupted data was sent to the GPU", ClassApplication, "RESTART_APP", "CHECK_APP/CUDA", ""),
	row(82, "ROBUST_CHANNEL_NVJPG0_ERROR", jpegDecoder+" (NVJPG0)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(83, "ROBUST_CHANNEL_NVDEC1_ERROR", videoDecoder+" (NVDEC1)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(84, "ROBUST_CHANNEL_NVDEC2_ERROR", videoDecoder+" (NVDEC2)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(85, "ROBUST_CHANNEL_CE9_ERROR", copyEngine+" (CE9)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(86, "ROBUST_CHANNEL_OFA0_ERROR", "Optical flow accelerator exception (OFA0); the affected contexts are stopped", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(88, "ROBUST_CHANNEL_NVDEC3_ERROR", videoDecoder+" (NVDEC3)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(89, "ROBUST_CHANNEL_NVDEC4_ERROR", videoDecoder+" (NVDEC4)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(92, "EXCESSIVE_SBE_INTERRUPTS", "High rate of corrected single-bit ECC errors", ClassInformational, "IGNORE", "CONTACT_SUPPORT", "Corrected errors lose no data; the rate is worth a person's look"),
	row(93, "INFOROM_ERASE_LIMIT_EXCEEDED", "The InfoROM passed its provisioned wear limit (not fatal)", ClassInformational, "IGNORE", "CONTACT_SUPPORT", ""),
	row(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Uncorrectable memory error contained to the contexts that touched it; other work goes on", ClassApplication, "RESTART_APP", "IGNORE (sympathetic)", "Only the affected processes are stopped; the GPU stays in service", citeMemory),
	row(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncorrectable memory error that could not be contained; all work on the GPU is affected", ClassResetGPU, "RESET_GPU", "IGNORE (sympathetic)", "", citeMemory),
	row(96, "ROBUST_CHANNEL_NVDEC5_ERROR", videoDecoder+" (NVDEC5)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(97, "ROBUST_CHANNEL_NVDEC6_ERROR", videoDecoder+" (NVDEC6)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(98, "ROBUST_CHANNEL_NVDEC7_ERROR", videoDecoder+" (NVDEC7)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(99, "ROBUST_CHANNEL_NVJPG1_ERROR", jpegDecoder+" (NVJPG1)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(100, "ROBUST_CHANNEL_NVJPG2_ERROR", jpegDecoder+" (NVJPG2)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(101, "ROBUST_CHANNEL_NVJPG3_ERROR", jpegDecoder+" (NVJPG3)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(102, "ROBUST_CHANNEL_NVJPG4_ERROR", jpegDecoder+" (NVJPG4)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(103, "ROBUST_CHANNEL_NVJPG5_ERROR", jpegDecoder+" (NVJPG5)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(104, "ROBUST_CHANNEL_NVJPG6_ERROR", jpegDecoder+" (NVJPG6)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(105, "ROBUST_CHANNEL_NVJPG7_ERROR", jpegDecoder+" (NVJPG7)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(106, "SMBPBI_TEST_MESSAGE", "Test message sent through the out-of-band (SMBPBI) interface", ClassInformational, "IGNORE", "IGNORE", ""),
	row(107, "SMBPBI_TEST_MESSAGE_SILENT", "Silent test message sent through the out-of-band (SMBPBI) interface", ClassInformational, "IGNORE", "IGNORE", ""),
	row(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "A context switch timed out", ClassResetGPU, "RESET_GPU", "CONTACT_SUPPORT", "The NVIDIA device plugin skips 109 as an application error by default; the catalogue resets the GPU, which is followed here (a policy may override it to Application)", citeDevicePlugin),
	row(110, "SEC_FAULT_ERROR", "Security fault", ClassResetGPU, "RESET_GPU", "INVESTIGATE_SW", ""),
	row(119, "GSP_RPC_TIMEOUT", "The driver timed out waiting for the GPU System Processor (GSP) firmware", ClassResetGPU, "RESET_GPU", "INVESTIGATE_SW", "The investigation points at software (driver, firmware), not hardware"),
	row(120, "GSP_ERROR", "The GSP firmware reported an error", ClassResetGPU, "RESET_GPU", "INVESTIGATE_SW", "The investigation points at software (driver, firmware), not hardware"),
	row(121, "C2C_ERROR", "Error on the chip-to-chip (C2C) link", ClassInformational, "IGNORE", "CONTACT_SUPPORT", ""),
	row(126, "ROBUST_CHANNEL_CE10_ERROR", copyEngine+" (CE10)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(127, "ROBUST_CHANNEL_CE11_ERROR", copyEngine+" (CE11)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(128, "ROBUST_CHANNEL_CE12_ERROR", copyEngine+" (CE12)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(129, "ROBUST_CHANNEL_CE13_ERROR", copyEngine+" (CE13)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(130, "ROBUST_CHANNEL_CE14_ERROR", copyEngine+" (CE14)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(131, "ROBUST_CHANNEL_CE15_ERROR", copyEngine+" (CE15)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(132, "ROBUST_CHANNEL_CE16_ERROR", copyEngine+" (CE16)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(133, "ROBUST_CHANNEL_CE17_ERROR", copyEngine+" (CE17)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(134, "ROBUST_CHANNEL_CE18_ERROR", copyEngine+" (CE18)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(135, "ROBUST_CHANNEL_CE19_ERROR", copyEngine+" (CE19)", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(136, "ALI_TRAINING_FAIL", "NVLink link training failed", ClassResetGPU, "RESET_GPU", "INVESTIGATE_LINK_SI", ""),
	row(137, "NVLINK_PRIV_ERR", "NVLink privilege error", ClassInformational, "IGNORE", "XID_137_FLOW", ""),
	row(139, "ROBUST_CHANNEL_OFA1_ERROR", "Optical flow accelerator exception (OFA1); the affected contexts are stopped", ClassApplication, "RESTART_APP", "CONTACT_SUPPORT", ""),
	row(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "An uncorrectable ECC error escaped containment", ClassResetGPU, "RESET_GPU", "CONTACT_SUPPORT", "", citeMemory),
	row(141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA fast-path error", ClassInformational, "IGNORE", "CONTACT_SUPPORT", ""),
	row(142, "ROBUST_CHANNEL_NVENC3_ERROR", "Video encoder exception (NVENC3)", ClassResetGPU, "CONTACT_SUPPORT", "", "The immediate action is to contact support, which names no automatic action; a GPU reset is the safer default (a policy may override it)"),
	row(143, "GPU_INIT_ERROR", "GPU initialisation failed", ClassResetGPU, "RESET_GPU", "CONTACT_SUPPORT", ""),
	row(144, "NVLINK_SAW_ERROR", "NVLink 5 error in the SAW unit", ClassResetGPU, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", nvlink5Note),
	row(145, "NVLINK_RLW_ERROR", "NVLink 5 error in the RLW unit", ClassResetGPU, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", nvlink5Note),
	row(146, "NVLINK_TLW_ERROR", "NVLink 5 error in the TLW unit", ClassResetGPU, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", nvlink5Note),
	row(147, "NVLINK_TREX_ERROR", "NVLink 5 error in the TREX unit", ClassResetGPU, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", nvlink5Note),
	row(148, "NVLINK_NVLPW_CTRL_ERROR", "NVLink 5 error in the NVLPW_CTRL unit", ClassResetGPU, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", nvlink5Note),
	row(149, "NVLINK_NETIR_ERROR", "NVLink 5 error in the NETIR unit (link events, link down)", ClassResetGPU, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", nvlink5Note),
	row(150, "NVLINK_MSE_ERROR", "NVLink 5 error in the MSE unit (firmware watchdog)", ClassResetGPU, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", nvlink5Note),
	row(151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Confidential-computing key rotation failed", ClassReboot, "RESTART_VM", "CONTACT_SUPPORT", "NVIDIA restarts the (virtual) machine: for a node, a reboot"),
	row(152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "Deep-learning accelerator (DLA) SMMU error", ClassInformational, "IGNORE", "CONTACT_SUPPORT", ""),
	row(153, "ROBUST_CHANNEL_DLA_TIMEOUT", "Deep-learning accelerator (DLA) timeout", ClassInformational, "IGNORE", "CONTACT_SUPPORT", ""),
	row(154, "GPU_RECOVERY_ACTION_CHANGED", "The driver changed the GPU's recommended recovery action; it accompanies the XID that caused it", ClassInformational, "XID_154", "N/A (informational, about another Xid)", "By code alone nothing to do: the XID it accompanies carries the class; ClassifyEvent reads the action from the message", citeMemory, citeRecoveryAction),
	row(155, "NVLINK_SW_DEFINED_ERROR", "Software-defined NVLink error", ClassResetGPU, "RESET_GPU", "INVESTIGATE_SW_USER", ""),
	row(156, "RESOURCE_RETIREMENT_EVENT", "A hardware resource was retired; a GPU reset puts the retirement into effect", ClassResetGPU, "RESET_GPU", "IGNORE", ""),
	row(157, "RESOURCE_RETIREMENT_FAILURE", "Retiring a hardware resource failed", ClassInformational, "IGNORE", "CONTACT_SUPPORT", "No immediate action; worth a person's look"),
	row(158, "GPU_FATAL_TIMEOUT", "Fatal GPU timeout", ClassResetGPU, "RESET_GPU", "CONTACT_SUPPORT", ""),
	row(159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "Non-data error on the coherent CPU-GPU interconnect (CHI)", ClassReboot, "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO", "NVIDIA points at the unified-memory (UVM) driver, a host kernel module a GPU reset leaves as it is; a reboot reloads it (the safer class; not clear-cut)"),
	row(160, "CHANNEL_RETIREMENT_EVENT", "A channel was retired", ClassInformational, "IGNORE", "INVESTIGATE_SW", ""),
	row(161, "CHANNEL_RETIREMENT_FAILURE", "Retiring a channel failed", ClassInformational, "IGNORE", "INVESTIGATE_SW", ""),
	row(162, "PSHC_REENGAGED", "Power-smoothing circuitry engaged again", ClassInformational, "", "", noBucket+"a state change, not a fault"),
	row(163, "PSHC_DISENGAGED", "Power-smoothing circuitry disengaged", ClassInformational, "", "", noBucket+"a state change, not a fault"),
	row(164, "PSHC_LOW_LIFETIME", "Power-smoothing circuitry is near the end of its life", ClassInformational, "", "", noBucket+"a wear warning; the GPU keeps working"),
	row(165, "PSHC_ZERO_LIFETIME", "Power-smoothing circuitry has reached the end of its life", ClassInformational, "", "", noBucket+"the GPU keeps working without power smoothing; service is for a person to plan"),
	row(166, "NVLINK_SECURE_CRYPTO_ERR", "Confidential-computing traffic on an NVLink before the link was set up for encryption", ClassResetGPU, "", "", noBucket+"a GPU reset re-initialises the link state (the ladder escalates if it does not help)"),
	row(167, "PCIE_FATAL_TIMEOUT", "Fatal PCIe timeout", ClassReboot, "", "", noBucket+"like a GPU off the bus (79), a reset cannot be relied on to reach it"),
	row(168, "REDUCED_GPU_MEMORY_CAPACITY", "Errors in the write-protected memory region; usable GPU memory is reduced", ClassResetGPU, "", "", noBucket+"a reset re-initialises the region; a recurrence ends in RecoveryFailed (not clear-cut: a policy may choose Replace)"),
	row(169, "SEC2_HALT_ERROR", "An internal micro-controller (SEC2) halted", ClassResetGPU, "", "", noBucket+"treated like the PMU halt (62), which the catalogue resets"),
	row(170, "NVLINK_SECURE_OTHER", "Unexpected NVLink interrupt in confidential-computing mode", ClassResetGPU, "", "", noBucket+"treated like 166"),
	row(171, "UNCORRECTABLE_DRAM_ERROR", "Detail of an XID 48: the uncorrectable error was in DRAM", ClassResetGPU, "", "", noBucket+"the class of the XID 48 it details", citeMemory),
	row(172, "UNCORRECTABLE_SRAM_ERROR", "Detail of an XID 48: the uncorrectable error was in on-chip SRAM", ClassResetGPU, "", "", noBucket+"the class of the XID 48 it details", citeMemory),
}
