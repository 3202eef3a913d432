#!/usr/bin/env python
# ruff: noqa: UP010, E501, B007, E741, UP031  (MXNet's example code, kept as written)
# Adapted from apache/mxnet 1.9.1 example/distributed_training/cifar10_dist.py (Apache-2.0).
"""MXNet 1.9.1's ``example/distributed_training/cifar10_dist.py``, kept in its shape for the
migration tests (``tests/e2e/test_any_script.py`` changes its Trainer line only): a
``kv.create('dist')`` store, its own SplitSampler, ``split_and_load`` over a list of contexts,
``gluon.Trainer(..., 'adam', {'learning_rate': .001}, kvstore=store)`` and
``step(this_batch_size)``.

What differs from the example so that it runs here in seconds: synthetic CIFAR-shaped data
(``--samples`` random 8x8x3 images with learnable labels, the same on every worker; nothing
downloaded), 2 CPU contexts instead of 4 GPUs, a small conv+BN net instead of resnet18_v1, 2
epochs, a seeded shuffle; options ``--optimizer``/``--lr``/``--lr-step`` (a MultiFactor
schedule), ``--step-size global`` (``step(this_batch_size * num_workers)``, as a gluon script
that normalises by the global batch itself) and ``--out PREFIX``: every worker writes
``PREFIX-<rank>.params`` and prints one line per epoch with the trainer's LR and update count.
"""

from __future__ import print_function

import argparse
import random
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, kv, nd

parser = argparse.ArgumentParser()
parser.add_argument("--optimizer", default="adam")
parser.add_argument("--lr", type=float, default=.001)
parser.add_argument("--lr-step", type=int, nargs="*", default=[])
parser.add_argument("--samples", type=int, default=256)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--step-size", choices=["local", "global"], default="local")
parser.add_argument("--out", required=True)
opt = parser.parse_args()

# Create a distributed key-value store
store = kv.create('dist')

# Clasify the images into one of the 10 digits
num_outputs = 10

# 8 images in a batch
batch_size_per_gpu = 8
# How many epochs to run the training
epochs = opt.epochs

# How many GPUs per machine
gpus_per_machine = 2
# Effective batch size across all GPUs
batch_size = batch_size_per_gpu * gpus_per_machine

# Create the context (a list of all GPUs to be used for training)
ctx = [mx.cpu(i) for i in range(gpus_per_machine)]


# Convert to float 32
# Having channel as the first dimension makes computation more efficient. Hence the (2,0,1) transpose.
# Dividing by 255 normalizes the input between 0 and 1
def transform(data, label):
    return nd.transpose(data.astype(np.float32), (2, 0, 1))/255, label.astype(np.float32)


class SplitSampler(gluon.data.sampler.Sampler):
    """ Split the dataset into `num_parts` parts and sample from the part with index `part_index`

    Parameters
    ----------
    length: int
      Number of examples in the dataset
    num_parts: int
      Partition the data into multiple parts
    part_index: int
      The index of the part to read from
    """
    def __init__(self, length, num_parts=1, part_index=0):
        # Compute the length of each partition
        self.part_len = length // num_parts
        # Compute the start index for this partition
        self.start = self.part_len * part_index
        # Compute the end index for this partition
        self.end = self.start + self.part_len

    def __iter__(self):
        # Extract examples between `start` and `end`, shuffle and return them.
        indices = list(range(self.start, self.end))
        random.shuffle(indices)
        return iter(indices)

    def __len__(self):
        return self.part_len


def synthetic_cifar(samples, seed):
    """CIFAR-shaped (HWC uint8 images, float labels) and learnable: the label is the brightest
    of 10 fixed image patterns."""
    rng = np.random.RandomState(seed)
    images = rng.randint(0, 256, size=(samples, 8, 8, 3)).astype(np.uint8)
    patterns = rng.randn(num_outputs, 8 * 8 * 3)
    labels = (images.reshape(samples, -1) @ patterns.T).argmax(axis=1).astype(np.float32)
    return gluon.data.ArrayDataset(mx.nd.array(images, dtype=np.uint8), mx.nd.array(labels))


random.seed(store.rank)
mx.random.seed(store.rank)

# Load the training data
train_data = gluon.data.DataLoader(synthetic_cifar(opt.samples, 0).transform(transform), batch_size,
                                   sampler=SplitSampler(opt.samples, store.num_workers, store.rank))

# Load the test data
test_data = gluon.data.DataLoader(synthetic_cifar(64, 1).transform(transform),
                                  batch_size, shuffle=False)

# A small conv+BN net instead of the model zoo's ResNet
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
        gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(num_outputs))

# Initialize the parameters with Xavier initializer
net.collect_params().initialize(mx.init.Xavier(), ctx=ctx)

# SoftmaxCrossEntropy is the most common choice of loss function for multiclass classification
softmax_cross_entropy = gluon.loss.SoftmaxCrossEntropyLoss()

optimizer_params = {'learning_rate': opt.lr}
if opt.lr_step:
    optimizer_params['lr_scheduler'] = mx.lr_scheduler.MultiFactorScheduler(
        step=opt.lr_step, factor=0.5, base_lr=opt.lr)

# Use Adam optimizer. Ask trainer to use the distributor kv store.
trainer = gluon.Trainer(net.collect_params(), opt.optimizer, optimizer_params, kvstore=store)


# Evaluate accuracy of the given network using the given data
def evaluate_accuracy(data_iterator, network):
    """ Measure the accuracy of ResNet

    Parameters
    ----------
    data_iterator: Iter
      examples of dataset
    network:
      ResNet

    Returns
    ----------
    tuple of array element
    """
    acc = mx.metric.Accuracy()

    # Iterate through data and label
    for i, (data, label) in enumerate(data_iterator):

        # Get the data and label into the GPU
        data = data.as_in_context(ctx[0])
        label = label.as_in_context(ctx[0])

        # Get network's output which is a probability distribution
        # Apply argmax on the probability distribution to get network's classification.
        output = network(data)
        predictions = nd.argmax(output, axis=1)

        # Give network's prediction and the correct label to update the metric
        acc.update(preds=predictions, labels=label)

    # Return the accuracy
    return acc.get()[1]


# We'll use cross entropy loss since we are doing multiclass classification
loss = gluon.loss.SoftmaxCrossEntropyLoss()


# Run one forward and backward pass on multiple GPUs
def forward_backward(network, data, label):

    # Ask autograd to remember the forward pass
    with autograd.record():
        # Compute the loss on all GPUs
        losses = [loss(network(X), Y) for X, Y in zip(data, label)]

    # Run the backward pass (calculate gradients) on all GPUs
    for l in losses:
        l.backward()


# Train a batch using multiple GPUs
def train_batch(batch_list, context, network, gluon_trainer):
    """ Training with multiple GPUs

    Parameters
    ----------
    batch_list: List
      list of dataset
    context: List
      a list of all GPUs to be used for training
    network:
      ResNet
    gluon_trainer:
      rain module of gluon
    """
    # Split and load data into multiple GPUs
    data = batch_list[0]
    data = gluon.utils.split_and_load(data, context)

    # Split and load label into multiple GPUs
    label = batch_list[1]
    label = gluon.utils.split_and_load(label, context)

    # Run the forward and backward pass
    forward_backward(network, data, label)

    # Update the parameters
    this_batch_size = batch_list[0].shape[0]
    if opt.step_size == "global":  # a script normalising by the global batch itself
        this_batch_size *= store.num_workers
    gluon_trainer.step(this_batch_size)


# Run as many epochs as required
for epoch in range(epochs):

    # Iterate through batches and run training using multiple GPUs
    batch_num = 1
    for batch in train_data:

        # Train the batch using multiple GPUs
        train_batch(batch, ctx, net, trainer)

        batch_num += 1

    # Print test accuracy after every epoch
    test_accuracy = evaluate_accuracy(test_data, net)
    print("Epoch %d: Test_acc %f lr %r num_update %d" % (epoch, test_accuracy,
                                                         trainer.learning_rate,
                                                         trainer.optimizer.num_update))
    sys.stdout.flush()

net.save_parameters("%s-%d.params" % (opt.out, store.rank))
