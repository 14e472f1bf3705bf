"""The device: its peak rates per precision, the denominator of effective MFU (peak.py), and
`bench doctor` (doctor.py: versions, ISA facts, toolchain, which engines can run here)."""
