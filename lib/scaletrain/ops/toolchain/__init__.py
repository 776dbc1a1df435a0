"""The kernels' toolchain, apart from the lessons in `scaletrain.ops`: nothing here is taught.

  nvcc.py                the CUDA sources compiled for sm_80 without a GPU; ptxas' register and spill
                         report; which kernels store to global memory (the compile checks of a1, a1b)
  triton_compile.py      the Triton kernels compiled for sm_80 without a GPU (the interpreter accepts
                         code the compiler rejects), and the local memory a build keeps (cuobjdump);
                         attention_compile.py: module 1b's signatures and its GPU launches' builds
  cuda_cpu_build.py      the CUDA emulator's libraries: kernels/*.cu rewritten and built by g++
                         against kernels/cuda_cpu/, cached
  cuda_cpu.py            the emulator as a backend ("cuda-cpu") over CPU tensors: the .cu kernels'
                         numbers, bounds and races checked on a CPU; attention_cuda_cpu.py: module 1b's
  isolated.py            a worker process whose TRITON_INTERPRET is fixed before triton is imported
  interpreter_compat.py  an older Triton's interpreter (3.6, a GPU machine's) beside NumPy >= 2.4
"""
