"""The NumPy engine's speed and storage, behind gpt2.py: how each weight matrix is laid out for the products,
measured on the machine at hand (layouts.py, which gpt2.GPT2Model uses, with the panel layouts of panels.py),
each product split over every core (threads.py), GPT-2 and both algorithms over a
batch of sequences, each row exactly as it decodes alone (gpt2_batched.py, sampling_batched.py, built on
gpt2.py and sampling.py), and TensorFlow's checkpoint format read and written without TensorFlow
(tf_checkpoint.py, which utils.py loads models with). NumPy only; nothing here changes what the reading
path computes, only how fast or from which files.
"""
