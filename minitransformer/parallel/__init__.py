"""Tensor parallelism: one model split over several processes, joined by collectives (lesson 15 shows it).

    communicator.py   the collectives behind one small interface: MPI (mpi4py, NumPy) or NCCL (CuPy), counted
    plan.py           which heads and FFN columns each rank holds; the sizes that cannot work, refused up front
    driver.py         rank 0 drives the loop and tells the workers each forward; the workers' loop
    launch.py         `--tensor-parallel-size N`: start the ranks under mpiexec, stop them whatever happens

This file imports nothing: plan.py and communicator.py sit low in the layer table (the model and the loader use
them), driver.py and launch.py high (they load models and run the generate loop).
"""
