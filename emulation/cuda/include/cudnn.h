#pragma once
// The emulated CUDA target's <cudnn.h> (a test tool: never in the production pdtrain). As in
// cuDNN 9, it only gathers the parts; the emulation has one: cudnn_graph.h, the subset of the
// graph (backend) API that pdtrain's cuDNN attention calls (src/kernels/cuda/cudnn_attention.cpp),
// implemented on the CPU by emulation/cuda/src/cudnn.cpp.
#include "cudnn_graph.h"
