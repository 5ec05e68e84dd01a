/* src/engine/cuda_probe.h — GPU utilisation for /metrics (docs/deployment.md), next to
 * the backend interface (backend.h). Device memory figures come from
 * dol_engine_memory_info (cudaMemGetInfo in the CUDA backend).
 *
 * dol_cuda_utilization: the percentage of time over NVML's last sample
 * period (1/6 s to 1 s, driver-dependent) during which a kernel ran on the
 * GPU the CUDA backend uses (CUDA device 0, matched to NVML by PCI bus id).
 * NVML is loaded with dlopen("libnvidia-ml.so.1") on the first call, so
 * dolphind has no link-time dependency on it. Returns 0 and sets *percent
 * (0..100), or -1 when NVML is absent, fails, or this build has no CUDA
 * (the function exists in every build, so callers need no #ifdef).
 * Thread-safe; cheap enough to call on every /metrics scrape. */
#ifndef DOLPHIN_ENGINE_CUDA_PROBE_H
#define DOLPHIN_ENGINE_CUDA_PROBE_H

int dol_cuda_utilization(int *percent);

#endif
