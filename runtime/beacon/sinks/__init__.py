"""The log's consumers, one file each: the spool thread, the S3 uploader and its index, the CloudWatch heartbeat
and its metric window, the TensorBoard view, the run's alarms, the tracker mirrors. They read the log and the
ranks' evidence; nothing below imports them."""
