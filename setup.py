"""tff_partial: train, send and store only part of a model in TensorFlow Federated."""

import setuptools

setuptools.setup(
    name='tff_partial',
    version='0.1.0',
    description=(
        'TensorFlow Federated building blocks for partially trainable, '
        'partially sent and private federated learning (FedPT, PVT, '
        'federated select, DP-FTRL, local adaptation).'
    ),
    packages=setuptools.find_packages(include=['tff_partial', 'tff_partial.*', 'tasks', 'tasks.*', 'scripts', 'scripts.*']),
    python_requires='>=3.9,<3.12',
    # Ranges for users installing into their own environment. The project's
    # own environment is installed from requirements.lock with --no-deps,
    # because tensorflow-federated==0.87.0 pins jax/jaxlib 0.4.14 (no wheel
    # for Python 3.11); see README.
    install_requires=[
        'tensorflow-federated>=0.87,<0.88',
        'tensorflow>=2.14,<2.15',
        'tensorflow-privacy>=0.9,<0.10',
        'dp-accounting>=0.4.3,<0.5',
        'absl-py>=1.0,<2',
        'numpy>=1.25,<2',
        'h5py>=3',
        'matplotlib>=3.5',
        'pillow>=9',
        'psutil>=5.9',
    ],
    extras_require={'test': ['pytest>=7', 'pytest-xdist>=3']},
)
