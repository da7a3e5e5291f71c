/* contrib/dev/fp8_lt_probe.cu - which FP8 type combinations this machine's cuBLASLt runs:
 * for each (A, B, C, D types, beta, scale pointers, algorithm from the heuristic or not,
 * alignment preferences, shape) it prints the heuristic's status and count and then
 * cublasLtMatmul's status on zero operands, all TN as kernels/cuda/gemm_fp8.cu calls it.
 * A diagnostic for a GPU whose FP8 GEMM is refused (kcuda_matmul_fp8: NOT_SUPPORTED).  On an
 * H100 with cuBLASLt 13.1 every case with the B scale 4 bytes after the A scale in one
 * allocation (scale 1) was refused; with each scale in its own allocation (scale 2) and
 * without scale pointers (scale 0) the GEMMs ran.  kcuda_matmul_fp8 passes the
 * dequantisation as alpha.
 *   nvcc -O1 -gencode arch=compute_90a,code=sm_90a contrib/dev/fp8_lt_probe.cu \
 *        -o build/fp8_lt_probe -lcublasLt && build/fp8_lt_probe */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdint.h>
static const char *nm(cudaDataType_t t){switch(t){case CUDA_R_32F:return "32F";case CUDA_R_16BF:return "16BF";case CUDA_R_16F:return "16F";case CUDA_R_8F_E4M3:return "E4M3";case CUDA_R_8F_E5M2:return "E5M2";default:return "?";}}
int try_one(cublasLtHandle_t lt, void *ws, size_t wsb, cudaDataType_t ta_, cudaDataType_t tb_, cudaDataType_t tc, cudaDataType_t td, float beta, int setscale, int usealgo, int m, int n, int k, int prefset)
{
    void *A,*B,*C,*D; float *s; cudaMalloc(&A,(size_t)m*k); cudaMalloc(&B,(size_t)n*k); cudaMalloc(&C,(size_t)m*n*4); cudaMalloc(&D,(size_t)m*n*4); cudaMalloc(&s,16);
    cudaMemset(A,0,(size_t)m*k); cudaMemset(B,0,(size_t)n*k); cudaMemset(C,0,(size_t)m*n*4);
    float one=1; cudaMemcpy(s,&one,4,cudaMemcpyHostToDevice); cudaMemcpy(s+1,&one,4,cudaMemcpyHostToDevice);
    cublasLtMatmulDesc_t op; cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t T=CUBLAS_OP_T,N=CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op,CUBLASLT_MATMUL_DESC_TRANSA,&T,sizeof T);
    cublasLtMatmulDescSetAttribute(op,CUBLASLT_MATMUL_DESC_TRANSB,&N,sizeof N);
    float *s2=NULL; cudaMalloc(&s2,256); cudaMemcpy(s2,&one,4,cudaMemcpyHostToDevice);
    const float *sa=s,*sb=setscale==2?s2:s+1; /* 2: each scale in an allocation of its own */
    if(setscale){cublasLtMatmulDescSetAttribute(op,CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,&sa,sizeof sa);cublasLtMatmulDescSetAttribute(op,CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,&sb,sizeof sb);}
    cublasLtMatrixLayout_t la,lb,lc,ld;
    cublasLtMatrixLayoutCreate(&la,ta_,k,m,k); cublasLtMatrixLayoutCreate(&lb,tb_,k,n,k); cublasLtMatrixLayoutCreate(&lc,tc,m,n,m); cublasLtMatrixLayoutCreate(&ld,td,m,n,m);
    cublasLtMatmulPreference_t pref; cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref,CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,&wsb,sizeof wsb);
    if(prefset){uint32_t al=16; cublasLtMatmulPreferenceSetAttribute(pref,CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,&al,4);cublasLtMatmulPreferenceSetAttribute(pref,CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,&al,4);cublasLtMatmulPreferenceSetAttribute(pref,CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,&al,4);cublasLtMatmulPreferenceSetAttribute(pref,CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,&al,4);}
    cublasLtMatmulHeuristicResult_t res; int found=0;
    cublasStatus_t h=cublasLtMatmulAlgoGetHeuristic(lt,op,la,lb,lc,ld,pref,1,&res,&found);
    float alpha=1;
    cublasStatus_t r=cublasLtMatmul(lt,op,&alpha,A,la,B,lb,&beta,C,lc,D,ld,(usealgo&&found)?&res.algo:NULL,ws,wsb,0);
    cudaError_t e=cudaDeviceSynchronize();
    printf("A %-4s B %-4s C %-4s D %-4s beta %g scale %d algo %d pref %d %dx%dx%d: heur %s found %d -> matmul %s (%s)\n",nm(ta_),nm(tb_),nm(tc),nm(td),beta,setscale,usealgo,prefset,m,n,k,cublasLtGetStatusString(h),found,cublasLtGetStatusString(r),cudaGetErrorString(e));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc); cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    cudaFree(A);cudaFree(B);cudaFree(C);cudaFree(D);cudaFree(s);cudaFree(s2);
    return 0;
}
int main(){
    cublasLtHandle_t lt; cublasLtCreate(&lt); printf("cublasLt version %zu\n", cublasLtGetVersion());
    void *ws; size_t wsb=32<<20; cudaMalloc(&ws,wsb);
    cudaDataType_t E4=CUDA_R_8F_E4M3,E5=CUDA_R_8F_E5M2,F=CUDA_R_32F,BF=CUDA_R_16BF;
    try_one(lt,ws,wsb,E4,E4,F,F,0,1,1,512,64,256,1);
    try_one(lt,ws,wsb,E4,E4,F,F,0,1,1,512,64,256,0);
    try_one(lt,ws,wsb,E4,E4,F,F,0,0,1,512,64,256,0);
    try_one(lt,ws,wsb,E4,E4,F,F,0,1,0,512,64,256,0);
    try_one(lt,ws,wsb,E4,E4,F,F,1,1,1,512,64,256,1);
    try_one(lt,ws,wsb,E4,E4,BF,BF,0,1,1,512,64,256,1);
    try_one(lt,ws,wsb,E4,E4,BF,F,0,1,1,512,64,256,1);
    try_one(lt,ws,wsb,E5,E4,F,F,0,1,1,512,64,256,1);
    try_one(lt,ws,wsb,E4,E5,F,F,0,1,1,512,64,256,1);
    try_one(lt,ws,wsb,E4,E4,F,F,0,1,1,4096,4096,4096,1);
    try_one(lt,ws,wsb,E4,E4,BF,BF,1,1,1,4096,4096,4096,1);
    try_one(lt,ws,wsb,E4,E4,F,F,0,2,1,512,64,256,1);
    /* without scale pointers (kcuda_matmul_fp8 passes the dequantisation as alpha) */
    try_one(lt,ws,wsb,E4,E4,F,F,1,0,1,512,64,256,1);
    try_one(lt,ws,wsb,E5,E4,F,F,0,0,1,512,64,256,1);
    try_one(lt,ws,wsb,E5,E4,F,F,1,0,1,512,64,256,1);
    try_one(lt,ws,wsb,E4,E5,F,F,1,0,1,512,64,256,1);
    try_one(lt,ws,wsb,E4,E4,F,F,1,0,1,4096,4096,4096,1);
    cudaFree(ws);
    cublasLtDestroy(lt);
    return 0;
}
