"""How far to trust the predictions: published reference runs, measured memory and serving runs, leave-one-source-
out refits, the GPU memory probe and stack calibration profiles."""
