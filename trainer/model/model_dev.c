/* model_dev.c - the model's side of the device (internal.h): turning the device's
 * failures into the model's errors, allocation and upload with the model's messages. */
#include "model/internal.h"

int dev_check(kdev *dev, hearth_err *err)
{
    int rc = kdev_status(dev);
    if (rc)
        return herr_set(err, rc, "device %s: %s", kdev_name(dev), kdev_errmsg(dev));
    return 0;
}

int dev_alloc(kdev *dev, void **p, size_t bytes, const char *what, hearth_err *err)
{
    if (kdev_alloc(dev, p, bytes))
        return herr_set(err, HERR_NOMEM, "model: %s: %zu bytes on device %s: %s", what, bytes,
                        kdev_name(dev), kdev_errmsg(dev));
    return 0;
}

int dev_upload(kdev *dev, void *dst, const void *host, size_t bytes, hearth_err *err)
{
    if (kdev_upload(dev, dst, host, bytes))
        return dev_check(dev, err);
    return 0;
}

int max_seqlen(const int *cu, int nseq)
{
    int m = 0;
    for (int s = 0; s < nseq; s++)
        if (cu[s + 1] - cu[s] > m)
            m = cu[s + 1] - cu[s];
    return m;
}
