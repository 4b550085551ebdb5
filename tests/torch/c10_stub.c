/* A stand-in for PyTorch's libc10.so (soname libc10.so, nothing in it): loaded by
 * test_torch_raise, it makes libweft_torch.so act as it does inside PyTorch. */
int weft_test_c10_stub;
