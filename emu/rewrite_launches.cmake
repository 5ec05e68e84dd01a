# emu/rewrite_launches.cmake — turns one kernels/*.cu into host C++ for the
# CUDA emulation: `k<<<grid, block[, smem[, stream]]>>>(args)` becomes
# DOL_EMU_LAUNCH(k, grid, block, ...)(args) (emu/cuda_emu.h), and
# `extern __shared__ T name[];` a pointer to the launch's dynamic shared
# memory. A #line directive keeps diagnostics pointing at the .cu file.
# Usage: cmake -DIN=<file.cu> -DOUT=<file.cpp> -P emu/rewrite_launches.cmake
file(READ "${IN}" src)
string(REGEX REPLACE
  "([A-Za-z_][A-Za-z0-9_:]*(<[^<>;]*>)?)[ \t]*<<<([^>]*)>>>"
  "DOL_EMU_LAUNCH(\\1, \\3)" src "${src}")
string(REGEX REPLACE
  "extern[ \t]+__shared__[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*\\[[ \t]*\\][ \t]*;"
  "\\1 *const \\2 = static_cast<\\1 *>(dol_emu_dyn_smem());" src "${src}")
if(src MATCHES "<<<|>>>")
  message(FATAL_ERROR "${IN}: a kernel launch the emulation cannot rewrite")
endif()
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${src}")
file(RENAME "${OUT}.tmp" "${OUT}")
