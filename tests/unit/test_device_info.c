/* test_device_info.c - device library versions as text and the bf16 peaks MFU divides by
 * (trainer/device_info.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "device_info.h"

static void test_version_text(void **state)
{
    (void)state;
    char b[32];
    assert_string_equal(device_version_text(b, sizeof b, KDEV_LIB_CUDA_RUNTIME, 13000), "13.0");
    assert_string_equal(device_version_text(b, sizeof b, KDEV_LIB_CUDA_RUNTIME, 12080), "12.8");
    assert_string_equal(device_version_text(b, sizeof b, KDEV_LIB_CUBLASLT, 130100), "13.1.0");
    assert_string_equal(device_version_text(b, sizeof b, KDEV_LIB_CUBLASLT, 120903), "12.9.3");
    /* no library (the cpu): NULL and an empty buffer */
    assert_null(device_version_text(b, sizeof b, KDEV_LIB_CUBLASLT, 0));
    assert_string_equal(b, "");
    /* a short buffer truncates, never overruns */
    char s[4];
    assert_non_null(device_version_text(s, sizeof s, KDEV_LIB_CUBLASLT, 130100));
    assert_string_equal(s, "13.");
}

static void test_peaks(void **state)
{
    (void)state;
    /* the names as the CUDA driver reports them */
    assert_true(device_peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.4);
    assert_true(device_peak_bf16_tflops("NVIDIA H100 PCIe") == 756.0);
    assert_true(device_peak_bf16_tflops("NVIDIA H100 NVL") == 835.0);
    assert_true(device_peak_bf16_tflops("NVIDIA H200") == 989.4);
    assert_true(device_peak_bf16_tflops("NVIDIA GH200 480GB") == 989.4);
    assert_true(device_peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0);
    /* unknown devices have no peak: MFU is then null */
    assert_true(device_peak_bf16_tflops("cpu") == 0.0);
    assert_true(device_peak_bf16_tflops("NVIDIA GeForce RTX 4090") == 0.0);
    assert_true(device_peak_bf16_tflops(NULL) == 0.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_text),
        cmocka_unit_test(test_peaks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
