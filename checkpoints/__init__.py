"""Checkpoint files without TensorFlow or torch: OpenAI's GPT-2 release format, TensorFlow's TensorBundle V2
(tf_checkpoint.py, read and written), Hugging Face's safetensors (safetensors_file.py, read), and the atomic
writes every file of the kit goes through (atomic.py). utils.py loads models with them.
"""
