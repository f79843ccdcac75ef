"""`palmyra-serve doctor`: the preflight of an Ascend host. It reads what the field showed failing
(driver version, npu-smi, device nodes and who may open them, the visible-device variables, the
NPU's health and free HBM, architecture, soft-partitioned vNPUs) and ends with a verdict and the fix
for each failure. `palmyra-serve engine` runs the same checks on Ascend before vLLM starts.

host.py gathers (files under a root, the environment, one `npu-smi info` run); npu_smi.py parses
that table; checks.py judges, with no I/O; report.py prints and decides the exit status."""
