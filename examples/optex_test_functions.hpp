// optex_synthetic's test functions, those of the OptEx paper's Figure 2
// (arXiv 2402.11427): Sphere, Ackley, Rosenbrock and Levy in d dimensions,
// each with its gradient. Included by optex_synthetic.cpp inside its
// anonymous namespace, after the standard headers it uses (<cmath>,
// <numbers>, <span>, <string_view>, <vector>).
#pragma once

inline constexpr double pi = std::numbers::pi;

// Values and gradients are computed in double (sums over d = 1e5 terms would
// lose digits in float) and the gradient rounded to f32 once, as the optimizer
// holds it. Every function's minimum is 0, so the gap is f(x) itself.

struct TestFunction {
    std::string_view name;
    double (*value)(std::span<const float> x);
    // The value, and the gradient into grad (same size as x).
    double (*value_and_gradient)(std::span<const float> x, std::span<float> grad);
    double minimum;  // f*
};

inline double sphere(std::span<const float> x) {
    double sum = 0;
    for (float v : x) sum += static_cast<double>(v) * v;
    return sum;
}
inline double sphere_gradient(std::span<const float> x, std::span<float> grad) {
    for (std::size_t i = 0; i < x.size(); ++i) grad[i] = 2.0f * x[i];  // exact in f32
    return sphere(x);
}

// Ackley with a = 20, b = 0.2, c = 2 pi:
//   f = -a exp(-b sqrt(mean x^2)) - exp(mean cos(c x)) + a + e.
inline constexpr double ackley_a = 20, ackley_b = 0.2, ackley_c = 2 * pi;
struct AckleyMeans {
    double root_mean_square, mean_cos;
};
inline AckleyMeans ackley_means(std::span<const float> x) {
    double squares = 0, cosines = 0;
    for (float v : x) {
        squares += static_cast<double>(v) * v;
        cosines += std::cos(ackley_c * v);
    }
    const auto d = static_cast<double>(x.size());
    return {std::sqrt(squares / d), cosines / d};
}
inline double ackley_of(const AckleyMeans& m) {
    return -ackley_a * std::exp(-ackley_b * m.root_mean_square) - std::exp(m.mean_cos) + ackley_a + std::numbers::e;
}
inline double ackley(std::span<const float> x) { return ackley_of(ackley_means(x)); }
inline double ackley_gradient(std::span<const float> x, std::span<float> grad) {
    const AckleyMeans m = ackley_means(x);
    const auto d = static_cast<double>(x.size());
    // d/dx_i of the first term: a b exp(-b r) x_i / (d r), r the root mean
    // square (0 at r = 0, where the term has its cusp); of the second:
    // exp(mean cos) c sin(c x_i) / d.
    const double radial = m.root_mean_square > 0
                              ? ackley_a * ackley_b * std::exp(-ackley_b * m.root_mean_square) / (d * m.root_mean_square)
                              : 0.0;
    const double angular = std::exp(m.mean_cos) * ackley_c / d;
    for (std::size_t i = 0; i < x.size(); ++i)
        grad[i] = static_cast<float>(radial * x[i] + angular * std::sin(ackley_c * x[i]));
    return ackley_of(m);
}

// Rosenbrock: sum_{i < d-1} 100 (x_{i+1} - x_i^2)^2 + (1 - x_i)^2, minimum at x = 1.
inline double rosenbrock(std::span<const float> x) {
    double sum = 0;
    for (std::size_t i = 0; i + 1 < x.size(); ++i) {
        const double xi = x[i], next = x[i + 1];
        sum += 100 * (next - xi * xi) * (next - xi * xi) + (1 - xi) * (1 - xi);
    }
    return sum;
}
inline double rosenbrock_gradient(std::span<const float> x, std::span<float> grad) {
    const std::size_t d = x.size();
    for (std::size_t i = 0; i < d; ++i) {
        const double xi = x[i];
        double g = 0;
        if (i + 1 < d) g += -400 * xi * (x[i + 1] - xi * xi) - 2 * (1 - xi);  // the term that starts at i
        if (i > 0) g += 200 * (xi - static_cast<double>(x[i - 1]) * x[i - 1]);  // the term that ends at i
        grad[i] = static_cast<float>(g);
    }
    return rosenbrock(x);
}

// Levy, with w_i = 1 + (x_i - 1) / 4, minimum at x = 1:
//   sin^2(pi w_1) + sum_{i < d} (w_i - 1)^2 (1 + 10 sin^2(pi w_i + 1))
//                 + (w_d - 1)^2 (1 + sin^2(2 pi w_d)).
inline double levy_w(float x) { return 1 + (static_cast<double>(x) - 1) / 4; }
inline double levy(std::span<const float> x) {
    const std::size_t d = x.size();
    const double first = std::sin(pi * levy_w(x[0]));
    double sum = first * first;
    for (std::size_t i = 0; i + 1 < d; ++i) {
        const double w = levy_w(x[i]), s = std::sin(pi * w + 1);
        sum += (w - 1) * (w - 1) * (1 + 10 * s * s);
    }
    const double w = levy_w(x[d - 1]), s = std::sin(2 * pi * w);
    return sum + (w - 1) * (w - 1) * (1 + s * s);
}
inline double levy_gradient(std::span<const float> x, std::span<float> grad) {
    const std::size_t d = x.size();
    for (std::size_t i = 0; i < d; ++i) {
        const double w = levy_w(x[i]);
        double dw = 0;  // df/dw_i; dw_i/dx_i = 1/4
        if (i == 0) dw += pi * std::sin(2 * pi * w);
        if (i + 1 < d) {
            const double s = std::sin(pi * w + 1);
            dw += 2 * (w - 1) * (1 + 10 * s * s) + 10 * pi * (w - 1) * (w - 1) * std::sin(2 * (pi * w + 1));
        } else {
            const double s = std::sin(2 * pi * w);
            dw += 2 * (w - 1) * (1 + s * s) + 2 * pi * (w - 1) * (w - 1) * std::sin(4 * pi * w);
        }
        grad[i] = static_cast<float>(dw / 4);
    }
    return levy(x);
}

inline const std::vector<TestFunction>& all_functions() {
    static const std::vector<TestFunction> functions{
        {"sphere", sphere, sphere_gradient, 0.0},
        {"ackley", ackley, ackley_gradient, 0.0},
        {"rosenbrock", rosenbrock, rosenbrock_gradient, 0.0},
        {"levy", levy, levy_gradient, 0.0},
    };
    return functions;
}
