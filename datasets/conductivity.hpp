// Effective conductivity of a 2-D two-phase image: a finite-volume discretisation of steady
// diffusion solved by conjugate gradients, and the bounds any such value must respect.
#pragma once

#include <cstddef>
#include <span>

namespace ipupod::datasets {

struct ConductivitySolveOptions {
  double tolerance = 1e-7;         // on the relative residual |b - A u| / |b|
  std::size_t max_iterations = 0;  // 0 = 10 x the number of cells (ample for the preconditioner)
};

struct ConductivitySolution {
  double effective = 0;  // in the units of the cell conductivities
  std::size_t iterations = 0;
  double relative_residual = 0;
};

// Cell-centred finite volumes on a height x width grid of unit cells with conductivities `k`
// (row-major, all > 0): potential 1 on the west face (x = 0), 0 on the east face (x = width),
// no flux through north and south. Face conductances are harmonic means of the two cells
// (half a cell to a boundary face). The system is solved by conjugate gradients preconditioned
// with a modified incomplete Cholesky factorisation, MIC(0). The effective conductivity is the
// current through the medium times width / height (the mean of the west and east currents).
// Throws std::runtime_error naming the residual if the tolerance is not reached.
ConductivitySolution solve_effective_conductivity(std::span<const double> k, std::size_t height,
                                                  std::size_t width,
                                                  const ConductivitySolveOptions& options = {});

struct ConductivityBounds {
  double lower = 0, upper = 0;
};

// Wiener bounds (harmonic and arithmetic means): hold for any arrangement of the phases.
ConductivityBounds wiener_bounds(double k1, double k2, double fraction1);
// Hashin-Shtrikman bounds in two dimensions: the tightest for statistically isotropic media.
ConductivityBounds hashin_shtrikman_bounds_2d(double k1, double k2, double fraction1);

}  // namespace ipupod::datasets
