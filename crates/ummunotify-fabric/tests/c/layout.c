/* Prints the layout of the libfabric types ummunotify-fabric mirrors, as this C compiler sees
 * them through the installed headers; tests/layout.rs compares it with the Rust mirrors. */
#include <stddef.h>
#include <stdio.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext.h>

#define SIZE(t) printf("size %s %zu\n", #t, sizeof(struct t))
#define OFF(t, f) printf("offset %s.%s %zu\n", #t, #f, offsetof(struct t, f))
#define VAL(c) printf("value %s %lld\n", #c, (long long)(c))

int main(void)
{
	SIZE(fid); OFF(fid, fclass); OFF(fid, context); OFF(fid, ops);
	SIZE(fi_ops); OFF(fi_ops, size); OFF(fi_ops, close); OFF(fi_ops, bind);
	OFF(fi_ops, control); OFF(fi_ops, ops_open); OFF(fi_ops, tostr); OFF(fi_ops, ops_set);
	SIZE(fi_ops_mem_monitor); OFF(fi_ops_mem_monitor, size); OFF(fi_ops_mem_monitor, start);
	OFF(fi_ops_mem_monitor, stop); OFF(fi_ops_mem_monitor, subscribe);
	OFF(fi_ops_mem_monitor, unsubscribe); OFF(fi_ops_mem_monitor, valid);
	SIZE(fi_ops_mem_notify); OFF(fi_ops_mem_notify, size); OFF(fi_ops_mem_notify, notify);
	SIZE(fid_mem_monitor); OFF(fid_mem_monitor, fid); OFF(fid_mem_monitor, export_ops);
	OFF(fid_mem_monitor, import_ops);
	VAL(FI_CLASS_MEM_MONITOR); VAL(FI_CLASS_MR_CACHE);
	VAL(FI_EBUSY); VAL(FI_EINVAL); VAL(FI_ENOMEM); VAL(FI_ENOSYS); VAL(FI_EFAULT); VAL(FI_EAGAIN);
	VAL(FI_VERSION(1, 13)); VAL(FI_MAJOR_VERSION); VAL(FI_MINOR_VERSION);
	return 0;
}
