/*
 * cuda_abi_check.c — gpu/cudart.h checked against the real CUDA headers at
 * compile time (`make cuda-abi-check`; skipped where no CUDA toolkit is
 * installed).  Nothing here runs: the file compiles, or the ABI hwfs assumes
 * differs from the toolkit's.  hwfs itself never includes a CUDA header.
 *
 * Three kinds of checks:
 *  - every constant of cudart.h equals the CUDA one (the Makefile target also
 *    fails when a CUDART_ constant of cudart.h is not named in this file);
 *  - the types hwfs uses in place of CUDA's have the same size and alignment
 *    (cudart_err and the enums passed as int, the IPC handle, the opaque
 *    stream and event pointers);
 *  - every function of struct cudart has the shape of the real prototype.
 *    Each prototype is written once below (FUNCS) with its types as
 *    parameters, and instantiated twice: with CUDA's types it must be exactly
 *    the type of &cudaX from cuda_runtime_api.h, and with hwfs's types exactly
 *    the type of the table's member.  A parameter added, dropped, reordered or
 *    changed on either side breaks one of the two.  And the table must have no
 *    member that is not checked (its size is counted).
 */
#include <stddef.h>

#include <cuda_runtime_api.h>

#include "cudart.h"

#define SAME_TYPE(a, b) __builtin_types_compatible_p(a, b)

/* ------------------------------------------------------------- constants */

_Static_assert(CUDART_SUCCESS == cudaSuccess, "CUDART_SUCCESS");
_Static_assert(CUDART_ERR_MEMORY_ALLOCATION == cudaErrorMemoryAllocation,
	       "CUDART_ERR_MEMORY_ALLOCATION");
_Static_assert(CUDART_ERR_INSUFFICIENT_DRIVER == cudaErrorInsufficientDriver,
	       "CUDART_ERR_INSUFFICIENT_DRIVER");
_Static_assert(CUDART_ERR_NO_DEVICE == cudaErrorNoDevice, "CUDART_ERR_NO_DEVICE");
_Static_assert(CUDART_HOST_REGISTER_PORTABLE == cudaHostRegisterPortable,
	       "CUDART_HOST_REGISTER_PORTABLE");
_Static_assert(CUDART_MEMCPY_H2H == cudaMemcpyHostToHost, "CUDART_MEMCPY_H2H");
_Static_assert(CUDART_MEMCPY_H2D == cudaMemcpyHostToDevice, "CUDART_MEMCPY_H2D");
_Static_assert(CUDART_MEMCPY_D2H == cudaMemcpyDeviceToHost, "CUDART_MEMCPY_D2H");
_Static_assert(CUDART_STREAM_NON_BLOCKING == cudaStreamNonBlocking, "CUDART_STREAM_NON_BLOCKING");
_Static_assert(CUDART_IPC_LAZY_PEER_ACCESS == cudaIpcMemLazyEnablePeerAccess,
	       "CUDART_IPC_LAZY_PEER_ACCESS");
_Static_assert(CUDART_ATTR_CC_MAJOR == cudaDevAttrComputeCapabilityMajor, "CUDART_ATTR_CC_MAJOR");
_Static_assert(CUDART_ATTR_CC_MINOR == cudaDevAttrComputeCapabilityMinor, "CUDART_ATTR_CC_MINOR");
_Static_assert(CUDART_IPC_HANDLE_SIZE == CUDA_IPC_HANDLE_SIZE, "CUDART_IPC_HANDLE_SIZE");

/* ---------------------------------------- types hwfs passes in CUDA's place */

/* Same size and alignment: an integer of either is passed and returned the same way. */
#define SAME_ABI(ours, theirs)                                                                    \
	_Static_assert(sizeof(ours) == sizeof(theirs) && _Alignof(ours) == _Alignof(theirs),       \
		       #ours " is not laid out as " #theirs)

SAME_ABI(cudart_err, cudaError_t);
SAME_ABI(int, enum cudaDeviceAttr);
SAME_ABI(int, enum cudaMemcpyKind);
SAME_ABI(cudart_stream, cudaStream_t);
SAME_ABI(cudart_event, cudaEvent_t);
SAME_ABI(cudart_ipc_handle, cudaIpcMemHandle_t);
_Static_assert(sizeof(cudart_ipc_handle) == sizeof(cudaIpcMemHandle_t), "IPC handle size");
_Static_assert(sizeof(((cudart_ipc_handle *)0)->reserved) ==
		       sizeof(((cudaIpcMemHandle_t *)0)->reserved),
	       "IPC handle: both are one char array (passed by value alike)");

/* -------------------------------------------------------------- functions */

/*
 * F(name, return type, (parameters)) for each function of struct cudart, in
 * terms of E (cudaError_t), ATTR (enum cudaDeviceAttr), KIND (enum
 * cudaMemcpyKind), STREAM, EVENT and IPC (the handle, by value).
 */
#define FUNCS(F, E, ATTR, KIND, STREAM, EVENT, IPC)                                              \
	F(GetDeviceCount, E, (int *))                                                             \
	F(DriverGetVersion, E, (int *))                                                           \
	F(RuntimeGetVersion, E, (int *))                                                          \
	F(SetDevice, E, (int))                                                                    \
	F(DeviceGetAttribute, E, (int *, ATTR, int))                                              \
	F(DeviceGetPCIBusId, E, (char *, int, int))                                               \
	F(DeviceGetByPCIBusId, E, (int *, const char *))                                          \
	F(MemGetInfo, E, (size_t *, size_t *))                                                    \
	F(HostRegister, E, (void *, size_t, unsigned int))                                        \
	F(HostUnregister, E, (void *))                                                            \
	F(Malloc, E, (void **, size_t))                                                           \
	F(Free, E, (void *))                                                                      \
	F(MallocHost, E, (void **, size_t))                                                       \
	F(FreeHost, E, (void *))                                                                  \
	F(Memcpy, E, (void *, const void *, size_t, KIND))                                        \
	F(MemcpyAsync, E, (void *, const void *, size_t, KIND, STREAM))                           \
	F(StreamCreateWithFlags, E, (STREAM *, unsigned int))                                     \
	F(StreamSynchronize, E, (STREAM))                                                         \
	F(StreamDestroy, E, (STREAM))                                                             \
	F(EventCreate, E, (EVENT *))                                                              \
	F(EventRecord, E, (EVENT, STREAM))                                                        \
	F(EventSynchronize, E, (EVENT))                                                           \
	F(EventElapsedTime, E, (float *, EVENT, EVENT))                                           \
	F(EventDestroy, E, (EVENT))                                                               \
	F(IpcGetMemHandle, E, (IPC *, void *))                                                    \
	F(IpcOpenMemHandle, E, (void **, IPC, unsigned int))                                      \
	F(IpcCloseMemHandle, E, (void *))                                                         \
	F(DeviceSynchronize, E, (void))                                                           \
	F(GetErrorString, const char *, (E))                                                      \
	F(GetErrorName, const char *, (E))

/* The runtime's own prototype is the one written in FUNCS with CUDA's types. */
#define CHECK_CUDA(name, ret, params)                                                             \
	_Static_assert(SAME_TYPE(__typeof__(&cuda##name), ret(*) params),                         \
		       "cuda" #name ": cuda_runtime_api.h's prototype is not the one in FUNCS");
FUNCS(CHECK_CUDA, cudaError_t, enum cudaDeviceAttr, enum cudaMemcpyKind, cudaStream_t,
      cudaEvent_t, cudaIpcMemHandle_t)

/* The table's member is the same prototype with hwfs's types. */
#define CHECK_HWFS(name, ret, params)                                                             \
	_Static_assert(SAME_TYPE(__typeof__(((struct cudart *)0)->name), ret(*) params),          \
		       "struct cudart ." #name ": not the prototype in FUNCS");
FUNCS(CHECK_HWFS, cudart_err, int, int, cudart_stream, cudart_event, cudart_ipc_handle)

/* Every function pointer of the table is checked: none after the last one counted. */
#define COUNT(name, ret, params) +1
_Static_assert(offsetof(struct cudart, GetDeviceCount) +
			       (0 FUNCS(COUNT, , , , , , )) * sizeof(void (*)(void)) ==
		       sizeof(struct cudart),
	       "struct cudart has a member that FUNCS does not check");
